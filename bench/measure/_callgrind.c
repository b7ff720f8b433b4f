/* _callgrind: callgrind client requests around one measured call.
 *
 * bench/measure/instructions.py runs a child Python under
 * `valgrind --tool=callgrind --instr-atstart=no` and brackets each measured call with
 *
 *   start()       CALLGRIND_ZERO_STATS, then CALLGRIND_START_INSTRUMENTATION
 *   stop(label)   CALLGRIND_STOP_INSTRUMENTATION, then CALLGRIND_DUMP_STATS_AT(label)
 *
 * so each dump file holds the instructions of that call alone, under
 * "desc: Trigger: Client Request: <label>" (pytest-codspeed's instrumentation mode does the
 * same). Zeroing before instrumentation starts drops whatever an earlier stop left counted.
 *
 * The headers are vendored (bench/measure/vendor/valgrind/), so this builds everywhere; outside
 * valgrind each request is a few no-op instructions and running_on_valgrind() returns 0.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "valgrind/callgrind.h"
#include "valgrind/valgrind.h"

static PyObject *
start(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    CALLGRIND_ZERO_STATS;
    CALLGRIND_START_INSTRUMENTATION;
    Py_RETURN_NONE;
}

static PyObject *
stop(PyObject *module, PyObject *arg)
{
    CALLGRIND_STOP_INSTRUMENTATION;
    /* the label is read after instrumentation stops: its conversion is not counted */
    const char *label = PyUnicode_AsUTF8(arg);
    if (label == NULL) {
        return NULL;
    }
    if (strchr(label, '\n') != NULL) {
        /* a newline would end the dump's "desc:" line and the parser would misread it */
        PyErr_SetString(PyExc_ValueError, "a callgrind label cannot contain a newline");
        return NULL;
    }
    CALLGRIND_DUMP_STATS_AT(label);
    Py_RETURN_NONE;
}

static PyObject *
running_on_valgrind(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    /* the nesting depth: 0 natively, 1 under valgrind */
    return PyLong_FromUnsignedLong((unsigned long)RUNNING_ON_VALGRIND);
}

static PyMethodDef methods[] = {
    {"start", start, METH_NOARGS,
     "start()\n--\n\nZero callgrind's counters and start instrumenting (a no-op natively)."},
    {"stop", stop, METH_O,
     "stop(label, /)\n--\n\n"
     "Stop instrumenting and dump the counts since start() under label (a no-op natively)."},
    {"running_on_valgrind", running_on_valgrind, METH_NOARGS,
     "running_on_valgrind()\n--\n\nHow deep under valgrind this process runs: 0 natively."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.bench.measure._callgrind",
    .m_doc = "Callgrind client requests around a measured call (see bench/measure/instructions.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__callgrind(void)
{
    return PyModule_Create(&module_def);
}
