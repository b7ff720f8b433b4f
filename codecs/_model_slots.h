/* The model classes of codecs/model.py as the codecs' C extensions read and build them: frozen,
 * slotted dataclasses, each field a slot whose offset configure() finds once from the class's
 * member descriptors (model.py builds the same objects through the same descriptors:
 * object.__new__, then each slot's __set__). Included by _delta_accel.c, _protobuf_accel.c,
 * _openai_accel.c and _flatbuffers_accel.c, each a module of its own, so its functions are
 * static. */
#ifndef INFERWIRE_MODEL_SLOTS_H
#define INFERWIRE_MODEL_SLOTS_H

#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY */

enum { C_ID, C_MODEL, C_CREATED, C_INDEX, C_SEQ, C_TOKEN_IDS, C_TEXT, C_LOGPROBS, C_FINISH, C_USAGE,
       C_FIELDS };
enum { L_TOKEN, L_LOGPROB, L_TOP, L_FIELDS };
enum { T_TOKEN, T_LOGPROB, T_FIELDS };
enum { U_PROMPT, U_COMPLETION, U_FIELDS };

static const char *const CHUNK_FIELDS[C_FIELDS] = {
    "id", "model", "created", "index", "seq", "token_ids", "text", "logprobs", "finish_reason",
    "usage"};
static const char *const LOGPROB_FIELDS[L_FIELDS] = {"token", "logprob", "top"};
static const char *const TOP_FIELDS[T_FIELDS] = {"token", "logprob"};
static const char *const USAGE_FIELDS[U_FIELDS] = {"prompt_tokens", "completion_tokens"};

/* A model class and its fields' slot offsets (TokenChunk's C_FIELDS: the most of any class). */
typedef struct {
    PyTypeObject *type;
    Py_ssize_t offsets[C_FIELDS];
} ModelClass;

/* Find each field's slot offset from the class's member descriptor: enough to read the
 * fields of an instance. */
static inline int
bind_class(ModelClass *cls, PyObject *type, const char *const *names, Py_ssize_t count)
{
    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "configure() takes the model classes");
        return -1;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString(type, names[i]);
        if (descr == NULL) {
            return -1;
        }
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)descr)->d_common.d_type == tp;
        if (ok) {
            PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
            ok = member->type == T_OBJECT_EX && !(member->flags & READONLY) &&
                 member->offset >= (Py_ssize_t)sizeof(PyObject) &&
                 member->offset + (Py_ssize_t)sizeof(PyObject *) <= tp->tp_basicsize;
            cls->offsets[i] = member->offset;
        }
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_TypeError, "%s.%s is not a slot of a slotted class", tp->tp_name,
                         names[i]);
            return -1;
        }
    }
    Py_INCREF(type);
    Py_XSETREF(cls->type, tp);
    return 0;
}

/* bind_class for a module that builds instances: the class must have exactly these slots (no
 * other field a new instance would leave unset) and no __dict__. */
static inline int
bind_class_exact(ModelClass *cls, PyObject *type, const char *const *names, Py_ssize_t count)
{
    if (bind_class(cls, type, names, count) < 0) {
        return -1;
    }
    PyTypeObject *tp = (PyTypeObject *)type;
    if (tp->tp_basicsize != (Py_ssize_t)(sizeof(PyObject) + count * sizeof(PyObject *)) ||
        tp->tp_dictoffset != 0 || tp->tp_alloc == NULL || tp->tp_itemsize != 0) {
        PyErr_Format(PyExc_TypeError, "%s has other fields than this module writes",
                     tp->tp_name);
        return -1;
    }
    return 0;
}

/* The classes of a token chunk (TokenChunk, TokenLogprob, TopLogprob, Usage: configure()'s
 * first four arguments), bound exactly for a module that builds them. */
static inline int
bind_chunk_classes(ModelClass *chunk, ModelClass *logprob, ModelClass *top, ModelClass *usage,
                   PyObject *const *classes, int exact)
{
    int (*bind)(ModelClass *, PyObject *, const char *const *, Py_ssize_t) =
        exact ? bind_class_exact : bind_class;
    return bind(chunk, classes[0], CHUNK_FIELDS, C_FIELDS) < 0 ||
                   bind(logprob, classes[1], LOGPROB_FIELDS, L_FIELDS) < 0 ||
                   bind(top, classes[2], TOP_FIELDS, T_FIELDS) < 0 ||
                   bind(usage, classes[3], USAGE_FIELDS, U_FIELDS) < 0
               ? -1
               : 0;
}

/* A new instance with its slots set to values, whose references it steals (all of them, also
 * on failure). */
static inline PyObject *
new_instance(const ModelClass *cls, PyObject **values, Py_ssize_t count)
{
    PyObject *obj = cls->type->tp_alloc(cls->type, 0);
    if (obj == NULL) {
        for (Py_ssize_t i = 0; i < count; i++) {
            Py_DECREF(values[i]);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        *(PyObject **)((char *)obj + cls->offsets[i]) = values[i];
    }
    return obj;
}

#endif
