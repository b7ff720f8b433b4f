/* What every C extension of the codecs does alike: its method table's fast-call entries, the
 * module with its API_VERSION (codecs/extensions.py ignores a build whose version differs), the
 * RuntimeError of a call made before configure(), and the steps of one that hands what it does
 * not take back to its Python reference. Each extension is a module of its own, so these are
 * static. */
#ifndef INFERWIRE_EXTENSION_H
#define INFERWIRE_EXTENSION_H

#include <Python.h>

/* A METH_FASTCALL function as a method table's entry. */
#define FASTCALL(function) ((PyCFunction)(void (*)(void))(function))

/* The module of `def`, with its API_VERSION constant. */
static inline PyObject *
module_with_version(PyModuleDef *def, int api_version)
{
    PyObject *module = PyModule_Create(def);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "API_VERSION", api_version) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

/* 0 once configure() has bound the module's state; else -1 with a RuntimeError naming the
 * extension (`extension`: its module name, e.g. "_delta_accel"). */
static inline int
require_configured(int configured, const char *extension)
{
    if (!configured) {
        PyErr_Format(PyExc_RuntimeError, "%s.configure() was not called", extension);
        return -1;
    }
    return 0;
}

/* Results of an extension's steps: done, hand back to the Python reference, or an exception
 * is set. */
enum { STEP_OK = 0, STEP_BAIL = 1, STEP_ERROR = -1 };

/* Return from the enclosing step unless `step` is done. */
#define TRY(step)                                                                               \
    do {                                                                                        \
        int step_result_ = (step);                                                              \
        if (step_result_ != STEP_OK) {                                                          \
            return step_result_;                                                                \
        }                                                                                       \
    } while (0)

/* Hand back when `condition` holds, through the enclosing function's `step` and `done:`. */
#define BAIL_IF(condition)                                                                      \
    do {                                                                                        \
        if (condition) {                                                                        \
            step = STEP_BAIL;                                                                   \
            goto done;                                                                          \
        }                                                                                       \
    } while (0)

#endif
