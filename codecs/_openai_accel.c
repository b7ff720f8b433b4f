/* _openai_accel: the OpenAI chunk mapping of the dict codecs (json, orjson, msgpack), compiled.
 *
 * codecs/openai.py maps a TokenChunk to OpenAI's chat.completion.chunk object and back; its
 * Python functions (chunk_to_obj_reference, chunk_from_obj_reference) are the reference. On a
 * one-token chunk they cost more than orjson's dumps and loads themselves, so this module does
 * the same mapping for the shapes a stream has, and nothing else:
 *
 *   chunk_to_obj    a TokenChunk -> the reference's dict: the same keys in the same order (the
 *                   JSON bytes follow it), the same values, lists where it has lists;
 *   chunk_from_obj  the reference's dict -> the TokenChunk, on the default path only (read
 *                   with openai._float, position None).
 *
 * Anything else is the reference's: other arguments, an object that is not exactly a model
 * class, a field of another type, a non-finite logprob for JSON, a string with a lone
 * surrogate; a missing key, a value of another type (a bool where an int is read), a choices
 * list that is not one choice, object != "chat.completion.chunk". The function then calls the
 * reference with the arguments it was given, so the result, or the exception and its message,
 * is exactly the reference's. The only exceptions raised here are MemoryError, and
 * RuntimeError before configure().
 *
 * Hostile objects: reading a dict may run Python code (the __eq__ of a key whose hash collides
 * with the one looked up), and so may an allocation (a finalizer, through the GC). So every
 * value read, from a dict or a slot, is held by a strong reference while it is used.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY */

#include <math.h>

#include "_extension.h"
#include "_model_slots.h"

/* Bumped when an argument list changes: openai.py ignores a stale build that disagrees. */
#define API_VERSION 1

/* ---- the model classes, read and written through their slots ------------------------------ */


/* The keys and constant values of the OpenAI objects, interned once. */
enum {
    K_ID, K_OBJECT, K_CREATED, K_MODEL, K_SEQ, K_CHOICES, K_USAGE, K_INDEX, K_DELTA, K_LOGPROBS,
    K_FINISH_REASON, K_TOKEN_IDS, K_ROLE, K_CONTENT, K_TOKEN, K_LOGPROB, K_BYTES, K_TOP_LOGPROBS,
    K_PROMPT_TOKENS, K_COMPLETION_TOKENS, K_TOTAL_TOKENS, K_BINARY, K_EXTENSIONS, K_NUMBER,
    K_POSITION, V_CHUNK_OBJECT, V_ASSISTANT, STRINGS
};
static const char *const STRING_TEXT[STRINGS] = {
    "id", "object", "created", "model", "seq", "choices", "usage", "index", "delta", "logprobs",
    "finish_reason", "token_ids", "role", "content", "token", "logprob", "bytes", "top_logprobs",
    "prompt_tokens", "completion_tokens", "total_tokens", "binary", "extensions", "number",
    "position", "chat.completion.chunk", "assistant"};

/* The dicts chunk_to_obj makes, each with the reference's keys in the reference's order. One
 * is made as a copy of its shape's template, whose values are None but for the constants
 * ("object", "role"), and then each key's value is replaced: PyDict_Copy clones the template's
 * key table, a third of the cost of inserting the keys one by one. */
enum { D_OBJ, D_OBJ_USAGE, D_OBJ_EXT, D_OBJ_EXT_USAGE, D_CHOICE, D_CHOICE_EXT, D_DELTA,
       D_DELTA_FIRST, D_LOGPROBS, D_LOGPROB, D_TOP, D_USAGE, SHAPES };
#define MAX_KEYS 8
static const int SHAPE_KEYS[SHAPES][MAX_KEYS] = {
    [D_OBJ] = {K_ID, K_OBJECT, K_CREATED, K_MODEL, K_CHOICES, -1},
    [D_OBJ_USAGE] = {K_ID, K_OBJECT, K_CREATED, K_MODEL, K_CHOICES, K_USAGE, -1},
    [D_OBJ_EXT] = {K_ID, K_OBJECT, K_CREATED, K_MODEL, K_SEQ, K_CHOICES, -1},
    [D_OBJ_EXT_USAGE] = {K_ID, K_OBJECT, K_CREATED, K_MODEL, K_SEQ, K_CHOICES, K_USAGE, -1},
    [D_CHOICE] = {K_INDEX, K_DELTA, K_LOGPROBS, K_FINISH_REASON, -1},
    [D_CHOICE_EXT] = {K_INDEX, K_DELTA, K_LOGPROBS, K_FINISH_REASON, K_TOKEN_IDS, -1},
    [D_DELTA] = {K_CONTENT, -1},
    [D_DELTA_FIRST] = {K_ROLE, K_CONTENT, -1},
    [D_LOGPROBS] = {K_CONTENT, -1},
    [D_LOGPROB] = {K_TOKEN, K_LOGPROB, K_BYTES, K_TOP_LOGPROBS, -1},
    [D_TOP] = {K_TOKEN, K_LOGPROB, K_BYTES, -1},
    [D_USAGE] = {K_PROMPT_TOKENS, K_COMPLETION_TOKENS, K_TOTAL_TOKENS, -1},
};

static struct {
    int configured;
    ModelClass chunk, logprob, top, usage;
    PyObject *to_obj_reference;   /* openai.chunk_to_obj_reference */
    PyObject *from_obj_reference; /* openai.chunk_from_obj_reference */
    PyObject *default_number;     /* openai._float: the only number the fast path reads with */
    PyObject *str[STRINGS];
    PyObject *templates[SHAPES]; /* make_templates() */
} S;

#define SLOT(obj, cls, field) (*(PyObject **)((char *)(obj) + S.cls.offsets[field]))

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, "
                        "chunk_to_obj_reference, chunk_from_obj_reference, read_number)");
        return NULL;
    }
    S.configured = 0;
    if (bind_chunk_classes(&S.chunk, &S.logprob, &S.top, &S.usage, args, 1) < 0) {
        return NULL;
    }
    for (int i = 4; i < 7; i++) {
        if (!PyCallable_Check(args[i])) {
            PyErr_SetString(PyExc_TypeError, "configure() takes the reference functions");
            return NULL;
        }
    }
    Py_XSETREF(S.to_obj_reference, Py_NewRef(args[4]));
    Py_XSETREF(S.from_obj_reference, Py_NewRef(args[5]));
    Py_XSETREF(S.default_number, Py_NewRef(args[6]));
    S.configured = 1;
    Py_RETURN_NONE;
}

static int
make_templates(void)
{
    for (int shape = 0; shape < SHAPES; shape++) {
        if (S.templates[shape] != NULL) {
            continue;
        }
        PyObject *template = PyDict_New();
        if (template == NULL) {
            return -1;
        }
        for (int i = 0; i < MAX_KEYS && SHAPE_KEYS[shape][i] >= 0; i++) {
            int key = SHAPE_KEYS[shape][i];
            PyObject *value = key == K_OBJECT ? S.str[V_CHUNK_OBJECT]
                              : key == K_ROLE ? S.str[V_ASSISTANT]
                                              : Py_None;
            if (PyDict_SetItem(template, S.str[key], value) < 0) {
                Py_DECREF(template);
                return -1;
            }
        }
        S.templates[shape] = template;
    }
    return 0;
}

static inline PyObject *
new_dict(int shape)
{
    return PyDict_Copy(S.templates[shape]);
}

/* Set d[key] = value and release value; value NULL (its error, or a hand-back) passes through. */
static inline int
put(PyObject *d, int key, PyObject *value)
{
    if (value == NULL) {
        return -1;
    }
    int failed = PyDict_SetItem(d, S.str[key], value);
    Py_DECREF(value);
    return failed;
}

/* Every function below returns NULL without an exception set for "not a shape taken here":
 * the caller hands the whole call to the reference. */
#define HAND_BACK() (!PyErr_Occurred())

/* ---- chunk_to_obj ---------------------------------------------------------------------------- */

/* list(token.encode()) for an exact str; NULL without an exception for a lone surrogate (the
 * reference raises its UnicodeEncodeError). No UTF-8 cache is attached to the str. */
static PyObject *
utf8_list(PyObject *token)
{
    const unsigned char *data;
    Py_ssize_t size;
    PyObject *encoded = NULL;
    if (PyUnicode_IS_ASCII(token)) {
        data = PyUnicode_DATA(token);
        size = PyUnicode_GET_LENGTH(token);
    }
    else {
        encoded = PyUnicode_AsUTF8String(token);
        if (encoded == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                PyErr_Clear();
            }
            return NULL;
        }
        data = (const unsigned char *)PyBytes_AS_STRING(encoded);
        size = PyBytes_GET_SIZE(encoded);
    }
    PyObject *list = PyList_New(size);
    for (Py_ssize_t i = 0; list != NULL && i < size; i++) {
        PyObject *byte = PyLong_FromLong(data[i]); /* a cached small int */
        if (byte == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, i, byte);
    }
    Py_XDECREF(encoded);
    return list;
}

/* {"token", "logprob", "bytes"} of one logprob or alternative, in a dict of this shape (the
 * caller sets top_logprobs). token and logprob are held by the caller. */
static PyObject *
entry_obj(int shape, PyObject *token, PyObject *logprob, int binary)
{
    /* _finite and _any return the float itself; _finite raises for a non-finite one */
    if (token == NULL || logprob == NULL || !PyUnicode_CheckExact(token) ||
        !PyFloat_Check(logprob) || (!binary && !isfinite(PyFloat_AS_DOUBLE(logprob)))) {
        return NULL;
    }
    PyObject *entry = new_dict(shape);
    if (entry == NULL || PyDict_SetItem(entry, S.str[K_TOKEN], token) < 0 ||
        PyDict_SetItem(entry, S.str[K_LOGPROB], logprob) < 0 ||
        put(entry, K_BYTES, utf8_list(token)) < 0) {
        Py_XDECREF(entry);
        return NULL;
    }
    return entry;
}

/* top_logprobs: the entries of a tuple of TopLogprob. */
static PyObject *
alternatives_obj(PyObject *top, int binary)
{
    PyObject *list = PyList_New(PyTuple_GET_SIZE(top));
    for (Py_ssize_t j = 0; list != NULL && j < PyTuple_GET_SIZE(top); j++) {
        PyObject *alternative = PyTuple_GET_ITEM(top, j);
        PyObject *item = NULL;
        if (Py_IS_TYPE(alternative, S.top.type)) {
            PyObject *token = Py_XNewRef(SLOT(alternative, top, T_TOKEN));
            PyObject *value = Py_XNewRef(SLOT(alternative, top, T_LOGPROB));
            item = entry_obj(D_TOP, token, value, binary);
            Py_XDECREF(token);
            Py_XDECREF(value);
        }
        if (item == NULL) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, j, item);
    }
    return list;
}

/* The entry of one TokenLogprob, alternatives included. */
static PyObject *
logprob_obj(PyObject *lp, int binary)
{
    if (!Py_IS_TYPE(lp, S.logprob.type)) {
        return NULL;
    }
    PyObject *token = Py_XNewRef(SLOT(lp, logprob, L_TOKEN));
    PyObject *value = Py_XNewRef(SLOT(lp, logprob, L_LOGPROB));
    PyObject *top = Py_XNewRef(SLOT(lp, logprob, L_TOP));
    PyObject *entry = NULL;
    if (top != NULL && PyTuple_CheckExact(top)) {
        entry = entry_obj(D_LOGPROB, token, value, binary);
        if (entry != NULL && put(entry, K_TOP_LOGPROBS, alternatives_obj(top, binary)) < 0) {
            Py_CLEAR(entry);
        }
    }
    Py_XDECREF(token);
    Py_XDECREF(value);
    Py_XDECREF(top);
    return entry;
}

/* None, or {"content": [...]} */
static PyObject *
logprobs_obj(PyObject *logprobs, int binary)
{
    if (logprobs == Py_None) {
        return Py_NewRef(Py_None);
    }
    if (!PyTuple_CheckExact(logprobs)) {
        return NULL;
    }
    PyObject *content = PyList_New(PyTuple_GET_SIZE(logprobs));
    for (Py_ssize_t i = 0; content != NULL && i < PyTuple_GET_SIZE(logprobs); i++) {
        PyObject *entry = logprob_obj(PyTuple_GET_ITEM(logprobs, i), binary);
        if (entry == NULL) {
            Py_CLEAR(content);
            break;
        }
        PyList_SET_ITEM(content, i, entry);
    }
    PyObject *obj = content == NULL ? NULL : new_dict(D_LOGPROBS);
    if (obj == NULL) {
        Py_XDECREF(content);
        return NULL;
    }
    if (put(obj, K_CONTENT, content) < 0) { /* put released content */
        Py_DECREF(obj);
        return NULL;
    }
    return obj;
}

/* openai.usage_obj of an exact Usage with exact int fields. */
static PyObject *
usage_obj(PyObject *usage)
{
    if (!Py_IS_TYPE(usage, S.usage.type)) {
        return NULL;
    }
    PyObject *prompt = Py_XNewRef(SLOT(usage, usage, U_PROMPT));
    PyObject *completion = Py_XNewRef(SLOT(usage, usage, U_COMPLETION));
    PyObject *obj = NULL;
    if (prompt != NULL && completion != NULL && PyLong_CheckExact(prompt) &&
        PyLong_CheckExact(completion) && (obj = new_dict(D_USAGE)) != NULL) {
        if (PyDict_SetItem(obj, S.str[K_PROMPT_TOKENS], prompt) < 0 ||
            PyDict_SetItem(obj, S.str[K_COMPLETION_TOKENS], completion) < 0 ||
            put(obj, K_TOTAL_TOKENS, PyNumber_Add(prompt, completion)) < 0) {
            Py_CLEAR(obj);
        }
    }
    Py_XDECREF(prompt);
    Py_XDECREF(completion);
    return obj;
}

/* choices[0] */
static PyObject *
choice_obj(PyObject **field, int binary, int extensions)
{
    int overflow;
    long seq = PyLong_AsLongAndOverflow(field[C_SEQ], &overflow); /* an exact int: no error */
    PyObject *choice = NULL, *delta = new_dict(seq == 0 && !overflow ? D_DELTA_FIRST : D_DELTA);
    if (delta == NULL || PyDict_SetItem(delta, S.str[K_CONTENT], field[C_TEXT]) < 0 ||
        (choice = new_dict(extensions ? D_CHOICE_EXT : D_CHOICE)) == NULL ||
        PyDict_SetItem(choice, S.str[K_INDEX], field[C_INDEX]) < 0 ||
        PyDict_SetItem(choice, S.str[K_DELTA], delta) < 0 ||
        put(choice, K_LOGPROBS, logprobs_obj(field[C_LOGPROBS], binary)) < 0 ||
        PyDict_SetItem(choice, S.str[K_FINISH_REASON], field[C_FINISH]) < 0 ||
        (extensions && put(choice, K_TOKEN_IDS, PySequence_List(field[C_TOKEN_IDS])) < 0)) {
        Py_CLEAR(choice);
    }
    Py_XDECREF(delta);
    return choice;
}

/* The dict of chunk_to_obj_reference(chunk, binary=binary, extensions=extensions), from the
 * chunk's fields (held). */
static PyObject *
chunk_obj(PyObject **field, int binary, int extensions)
{
    PyObject *usage = field[C_USAGE];
    if (!PyLong_CheckExact(field[C_SEQ]) || !PyTuple_CheckExact(field[C_TOKEN_IDS])) {
        return NULL;
    }
    PyObject *choices = PyList_New(1);
    if (choices == NULL) {
        return NULL;
    }
    PyObject *choice = choice_obj(field, binary, extensions);
    if (choice == NULL) {
        Py_DECREF(choices);
        return NULL;
    }
    PyList_SET_ITEM(choices, 0, choice);
    int shape = extensions ? (usage == Py_None ? D_OBJ_EXT : D_OBJ_EXT_USAGE)
                           : (usage == Py_None ? D_OBJ : D_OBJ_USAGE);
    PyObject *obj = new_dict(shape); /* "object" is set in the template */
    if (obj == NULL || PyDict_SetItem(obj, S.str[K_ID], field[C_ID]) < 0 ||
        PyDict_SetItem(obj, S.str[K_CREATED], field[C_CREATED]) < 0 ||
        PyDict_SetItem(obj, S.str[K_MODEL], field[C_MODEL]) < 0 ||
        (extensions && PyDict_SetItem(obj, S.str[K_SEQ], field[C_SEQ]) < 0) ||
        PyDict_SetItem(obj, S.str[K_CHOICES], choices) < 0 ||
        (usage != Py_None && put(obj, K_USAGE, usage_obj(usage)) < 0)) {
        Py_CLEAR(obj);
    }
    Py_DECREF(choices);
    return obj;
}

PyDoc_STRVAR(chunk_to_obj_doc,
             "chunk_to_obj($module, chunk, *, binary=False, extensions=True)\n--\n\n"
             "openai.chunk_to_obj_reference, compiled: the same dict (keys in the same order).");

static PyObject *
chunk_to_obj(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (require_configured(S.configured, "_openai_accel") < 0) {
        return NULL;
    }
    int binary = 0, extensions = 1, fast = nargs == 1;
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; fast && i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        fast = value == Py_True || value == Py_False; /* the reference takes any truth value */
        if (name == S.str[K_BINARY]) {
            binary = value == Py_True;
        }
        else if (name == S.str[K_EXTENSIONS]) {
            extensions = value == Py_True;
        }
        else {
            fast = 0; /* another name, or one not interned: the reference sorts it out */
        }
    }
    if (fast && Py_IS_TYPE(args[0], S.chunk.type)) {
        PyObject *field[C_FIELDS];
        Py_ssize_t held = 0;
        for (; held < C_FIELDS; held++) {
            PyObject *value = SLOT(args[0], chunk, held);
            if (value == NULL) {
                break; /* an unset slot: the reference raises its AttributeError */
            }
            field[held] = Py_NewRef(value);
        }
        PyObject *obj = held == C_FIELDS ? chunk_obj(field, binary, extensions) : NULL;
        while (held > 0) {
            Py_DECREF(field[--held]);
        }
        if (obj != NULL || !HAND_BACK()) {
            return obj;
        }
    }
    return PyObject_Vectorcall(S.to_obj_reference, args, nargs, kwnames);
}

/* ---- chunk_from_obj -------------------------------------------------------------------------- */

/* d[key] as a new reference, if d is an exact dict that has it; NULL without an exception
 * otherwise (a lookup's own exception is the reference's to raise). */
static PyObject *
get(PyObject *d, int key)
{
    if (d == NULL || !PyDict_CheckExact(d)) {
        return NULL;
    }
    PyObject *value = PyDict_GetItemWithError(d, S.str[key]);
    if (value == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return Py_NewRef(value);
}

/* get() of a value of exactly this type (PyLong_CheckExact: a bool is not an int). */
static PyObject *
get_str(PyObject *d, int key)
{
    PyObject *value = get(d, key);
    if (value != NULL && !PyUnicode_CheckExact(value)) {
        Py_CLEAR(value);
    }
    return value;
}

static PyObject *
get_int(PyObject *d, int key)
{
    PyObject *value = get(d, key);
    if (value != NULL && !PyLong_CheckExact(value)) {
        Py_CLEAR(value);
    }
    return value;
}

/* openai._float(d[key]): a float as it is, an int as float(int). */
static PyObject *
get_number(PyObject *d, int key)
{
    PyObject *value = get(d, key);
    if (value == NULL || PyFloat_CheckExact(value)) {
        return value;
    }
    PyObject *number = NULL;
    if (PyLong_CheckExact(value)) {
        double as_double = PyLong_AsDouble(value);
        if (as_double == -1.0 && PyErr_Occurred()) {
            PyErr_Clear(); /* too large: the reference raises its OverflowError */
        }
        else {
            number = PyFloat_FromDouble(as_double);
        }
    }
    Py_DECREF(value);
    return number;
}

/* d[key] when it is an exact list, as a tuple of its items at the time. */
static PyObject *
get_list_items(PyObject *d, int key)
{
    PyObject *value = get(d, key);
    if (value == NULL) {
        return NULL;
    }
    PyObject *items = PyList_CheckExact(value) ? PyList_AsTuple(value) : NULL;
    Py_DECREF(value);
    return items;
}

/* A TopLogprob (top) or TokenLogprob (!top) from its dict. */
static PyObject *
logprob_from(PyObject *entry, int top)
{
    PyObject *values[L_FIELDS] = {NULL, NULL, NULL};
    values[L_TOKEN] = get_str(entry, K_TOKEN);
    if (values[L_TOKEN] != NULL) {
        values[L_LOGPROB] = get_number(entry, K_LOGPROB);
    }
    if (values[L_LOGPROB] == NULL) {
        Py_XDECREF(values[L_TOKEN]);
        return NULL;
    }
    if (top) {
        return new_instance(&S.top, values, T_FIELDS);
    }
    PyObject *items = get_list_items(entry, K_TOP_LOGPROBS);
    PyObject *alternatives = items == NULL ? NULL : PyTuple_New(PyTuple_GET_SIZE(items));
    for (Py_ssize_t j = 0; alternatives != NULL && j < PyTuple_GET_SIZE(items); j++) {
        PyObject *made = logprob_from(PyTuple_GET_ITEM(items, j), 1);
        if (made == NULL) {
            Py_CLEAR(alternatives);
            break;
        }
        PyTuple_SET_ITEM(alternatives, j, made);
    }
    Py_XDECREF(items);
    if (alternatives == NULL) {
        Py_DECREF(values[L_TOKEN]);
        Py_DECREF(values[L_LOGPROB]);
        return NULL;
    }
    values[L_TOP] = alternatives;
    return new_instance(&S.logprob, values, L_FIELDS);
}

/* The TokenChunk of chunk_from_obj_reference(obj), on the shape it reads. */
static PyObject *
chunk_from(PyObject *obj)
{
    PyObject *field[C_FIELDS] = {NULL};
    PyObject *object = NULL, *choices = NULL, *delta = NULL, *logprobs = NULL, *content = NULL;
    PyObject *usage = NULL, *chunk = NULL;
    if (!PyDict_CheckExact(obj)) {
        goto done;
    }
    object = get_str(obj, K_OBJECT);
    if (object == NULL || PyUnicode_Compare(object, S.str[V_CHUNK_OBJECT]) != 0) {
        goto done; /* the reference raises its DecodeError */
    }
    choices = get_list_items(obj, K_CHOICES);
    if (choices == NULL || PyTuple_GET_SIZE(choices) != 1) {
        goto done;
    }
    PyObject *choice = PyTuple_GET_ITEM(choices, 0); /* held by choices */
    if ((field[C_ID] = get_str(obj, K_ID)) == NULL ||
        (field[C_MODEL] = get_str(obj, K_MODEL)) == NULL ||
        (field[C_CREATED] = get_int(obj, K_CREATED)) == NULL ||
        (field[C_SEQ] = get_int(obj, K_SEQ)) == NULL ||
        (field[C_INDEX] = get_int(choice, K_INDEX)) == NULL ||
        (field[C_TOKEN_IDS] = get_list_items(choice, K_TOKEN_IDS)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(field[C_TOKEN_IDS]); i++) {
        if (!PyLong_CheckExact(PyTuple_GET_ITEM(field[C_TOKEN_IDS], i))) {
            goto done;
        }
    }
    delta = get(choice, K_DELTA);
    if ((field[C_TEXT] = get_str(delta, K_CONTENT)) == NULL ||
        (field[C_FINISH] = get(choice, K_FINISH_REASON)) == NULL ||
        (field[C_FINISH] != Py_None && !PyUnicode_CheckExact(field[C_FINISH])) ||
        (logprobs = get(choice, K_LOGPROBS)) == NULL) {
        goto done;
    }
    if (logprobs == Py_None) {
        field[C_LOGPROBS] = Py_NewRef(Py_None);
    }
    else {
        if ((content = get_list_items(logprobs, K_CONTENT)) == NULL) {
            goto done;
        }
        PyObject *entries = PyTuple_New(PyTuple_GET_SIZE(content));
        for (Py_ssize_t i = 0; entries != NULL && i < PyTuple_GET_SIZE(content); i++) {
            PyObject *entry = logprob_from(PyTuple_GET_ITEM(content, i), 0);
            if (entry == NULL) {
                Py_CLEAR(entries);
                break;
            }
            PyTuple_SET_ITEM(entries, i, entry);
        }
        if ((field[C_LOGPROBS] = entries) == NULL) {
            goto done;
        }
    }
    /* obj.get("usage") */
    usage = PyDict_GetItemWithError(obj, S.str[K_USAGE]);
    if (usage == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        goto done;
    }
    usage = Py_NewRef(usage == NULL ? Py_None : usage);
    if (usage == Py_None) {
        field[C_USAGE] = Py_NewRef(Py_None);
    }
    else {
        PyObject *counts[U_FIELDS] = {get_int(usage, K_PROMPT_TOKENS), NULL};
        if (counts[U_PROMPT] == NULL ||
            (counts[U_COMPLETION] = get_int(usage, K_COMPLETION_TOKENS)) == NULL) {
            Py_XDECREF(counts[U_PROMPT]);
            goto done;
        }
        if ((field[C_USAGE] = new_instance(&S.usage, counts, U_FIELDS)) == NULL) {
            goto done;
        }
    }
    chunk = new_instance(&S.chunk, field, C_FIELDS);
    for (int i = 0; i < C_FIELDS; i++) {
        field[i] = NULL; /* new_instance took them */
    }
done:
    for (int i = 0; i < C_FIELDS; i++) {
        Py_XDECREF(field[i]);
    }
    Py_XDECREF(object);
    Py_XDECREF(choices);
    Py_XDECREF(delta);
    Py_XDECREF(logprobs);
    Py_XDECREF(content);
    Py_XDECREF(usage);
    return chunk;
}

PyDoc_STRVAR(chunk_from_obj_doc,
             "chunk_from_obj(obj, number=read_number, *, position=None)\n\n"
             "openai.chunk_from_obj_reference, compiled for the default number and position.");

static PyObject *
chunk_from_obj(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (require_configured(S.configured, "_openai_accel") < 0) {
        return NULL;
    }
    int number_given = nargs == 2;
    int fast = nargs == 1 || (number_given && args[1] == S.default_number);
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; fast && i < keywords; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = args[nargs + i];
        if (name == S.str[K_NUMBER]) {
            fast = !number_given && value == S.default_number;
            number_given = 1;
        }
        else {
            fast = name == S.str[K_POSITION] && value == Py_None;
        }
    }
    if (fast) {
        PyObject *chunk = chunk_from(args[0]);
        if (chunk != NULL || !HAND_BACK()) {
            return chunk;
        }
    }
    return PyObject_Vectorcall(S.from_obj_reference, args, nargs, kwnames);
}

/* ---- the module ------------------------------------------------------------------------------ */

static PyMethodDef methods[] = {
    {"configure", FASTCALL(configure), METH_FASTCALL,
     "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, chunk_to_obj_reference, "
     "chunk_from_obj_reference, read_number, /)\n--\n\n"
     "Bind the model classes and the reference functions; call once before the rest."},
    {"chunk_to_obj", FASTCALL(chunk_to_obj), METH_FASTCALL | METH_KEYWORDS, chunk_to_obj_doc},
    {"chunk_from_obj", FASTCALL(chunk_from_obj), METH_FASTCALL | METH_KEYWORDS,
     chunk_from_obj_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.codecs._openai_accel",
    .m_doc = "The OpenAI chunk mapping of the dict codecs, compiled (see codecs/openai.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__openai_accel(void)
{
    for (int i = 0; i < STRINGS; i++) {
        if (S.str[i] == NULL && (S.str[i] = PyUnicode_InternFromString(STRING_TEXT[i])) == NULL) {
            return NULL;
        }
    }
    if (make_templates() < 0) {
        return NULL;
    }
    return module_with_version(&module_def, API_VERSION);
}
