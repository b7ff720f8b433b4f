/* _scan: depth and element limits checked on the bytes, before any parser builds an object.
 *
 * codecs/scan.py is the reference: its docstring gives the rules, and its pure-Python scanner
 * stays the fallback, with the same answers on any bytes. Two functions:
 *
 *   check_json     JSON text, lexed by byte class: strings (with their escapes) are skipped,
 *                  every string, container and run of scalar bytes is an element, and the
 *                  depth is the count of open brackets;
 *   check_msgpack  one MessagePack object, walked header by header with a stack of the
 *                  children each open container still owes; a map or array is charged its
 *                  declared children when its header is read, so a header claiming 2**32 - 1
 *                  is refused from its five bytes.
 *
 * Each raises DepthLimitError or ElementBudgetError (bound by configure()) at the first limit
 * exceeded and returns None otherwise. This is no validator: invalid or truncated bytes return
 * None, or one of the two errors, and the parser rejects them afterwards. Exact for valid input.
 *
 * Speed: JSON is taken 64 bytes at a time with SSE2 where there is SSE2 (bit masks of quotes,
 * brackets and scalar bytes; see scan_json_block), else byte by byte; both give the same
 * answers, and the tests run against both builds.
 *
 * Hostile bytes: every read is checked against the end of the buffer, lengths are compared as
 * uint64_t before use and payloads are skipped without being read. Each step moves forward
 * (a JSON block by 64 bytes at least), so a byte is read a few times at most and nothing
 * loops. Memory: none for JSON (a counter is its depth); for MessagePack, one uint64_t per open
 * container, in a fixed array up to SMALL_STACK and then grown by doubling: bounded by the
 * depth reached, never by max_depth.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#include "_extension.h"

/* Bumped when an argument list changes: scan.py ignores a stale build that disagrees. */
#define API_VERSION 1

#define SMALL_STACK 64
/* Limits past these are clamped: no input can reach them, and sums stay far from overflow
 * (a MessagePack header adds at most 2 * (2**32 - 1) elements). */
#define MAX_LIMIT ((uint64_t)1 << 62)

/* How a scan ended: within the limits (or at bytes it cannot follow), or which limit it hit.
 * SCAN_STOP: at bytes it cannot follow, inside the JSON scan (its callers return SCAN_OK). */
enum { SCAN_OK = 0, SCAN_DEPTH = 1, SCAN_BUDGET = 2, SCAN_STOP = 3, SCAN_ERROR = -1 };

static struct {
    PyObject *depth_error;  /* errors.DepthLimitError */
    PyObject *budget_error; /* errors.ElementBudgetError */
} S;

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1]) ||
        !PyType_IsSubtype((PyTypeObject *)args[0], (PyTypeObject *)PyExc_Exception) ||
        !PyType_IsSubtype((PyTypeObject *)args[1], (PyTypeObject *)PyExc_Exception)) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(DepthLimitError, ElementBudgetError) takes two exception "
                        "classes");
        return NULL;
    }
    Py_XSETREF(S.depth_error, Py_NewRef(args[0]));
    Py_XSETREF(S.budget_error, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* ---- JSON ----------------------------------------------------------------------------------- */

/* RFC 8259 section 2: the structural characters and the four whitespace bytes. Every other
 * byte is part of a scalar (number, true, false, null, or whatever invalid text the parser
 * will refuse): a run of them is one element. */
enum { J_SCALAR = 0, J_SPACE, J_SEP, J_OPEN, J_CLOSE, J_QUOTE };

static const uint8_t JSON_CLASS[256] = {
    [' '] = J_SPACE, ['\t'] = J_SPACE, ['\n'] = J_SPACE, ['\r'] = J_SPACE,
    [','] = J_SEP,   [':'] = J_SEP,    ['['] = J_OPEN,   ['{'] = J_OPEN,
    [']'] = J_CLOSE, ['}'] = J_CLOSE,  ['"'] = J_QUOTE,
};

/* Past the string whose body starts at p: the first quote not escaped, i.e. not preceded by an
 * odd run of backslashes inside the body. NULL if the string does not end. */
static inline const uint8_t *
skip_string(const uint8_t *p, const uint8_t *end)
{
    const uint8_t *body = p;
    for (;;) {
        const uint8_t *quote = memchr(p, '"', (size_t)(end - p));
        if (quote == NULL) {
            return NULL;
        }
        const uint8_t *run = quote;
        while (run > body && run[-1] == '\\') {
            run--;
        }
        p = quote + 1;
        if (((quote - run) & 1) == 0) {
            return p;
        }
    }
}

typedef struct {
    uint64_t depth, elements;
    uint64_t max_depth, max_elements;
    unsigned in_scalar; /* the byte before the next one belongs to a scalar */
} JsonScan;

/* The tokens that start before stop (each may run on to end); SCAN_STOP at an unterminated
 * string, which is not counted. *pp is left past the last token. */
static int
scan_json_bytes(JsonScan *scan, const uint8_t **pp, const uint8_t *stop, const uint8_t *end)
{
    const uint8_t *p = *pp;
    while (p < stop) {
        switch (JSON_CLASS[*p++]) {
        case J_SPACE:
        case J_SEP:
            break;
        case J_OPEN:
            if (++scan->depth > scan->max_depth) {
                return SCAN_DEPTH;
            }
            if (++scan->elements > scan->max_elements) {
                return SCAN_BUDGET;
            }
            break;
        case J_CLOSE:
            scan->depth -= scan->depth > 0; /* a stray close: the parser's to report */
            break;
        case J_QUOTE:
            if ((p = skip_string(p, end)) == NULL) {
                return SCAN_STOP;
            }
            if (++scan->elements > scan->max_elements) {
                return SCAN_BUDGET;
            }
            break;
        default: /* J_SCALAR */
            if (!scan->in_scalar && ++scan->elements > scan->max_elements) {
                return SCAN_BUDGET;
            }
            while (p < end && JSON_CLASS[*p] == J_SCALAR) {
                p++;
            }
            scan->in_scalar = 1;
            continue;
        }
        scan->in_scalar = 0;
    }
    *pp = p;
    return SCAN_OK;
}

/* SSE2 (every x86-64): 64 bytes at a time classified into bit masks, and their tokens counted
 * from the masks (simdjson's approach, much reduced). Strings come from the quotes' prefix XOR,
 * so a block holding a backslash goes to the byte loop, as does a string left open at the end
 * of a block (from its opening quote). Without SSE2, or built with -DINFERWIRE_SCAN_NO_SIMD
 * (how the tests of that path are run), the byte loop does everything, with the same answers. */
#if defined(__SSE2__) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(INFERWIRE_SCAN_NO_SIMD)
#include <emmintrin.h>
#define JSON_BLOCK 64

/* Without -mpopcnt, __builtin_popcountll is a call into libgcc. */
static inline uint64_t
popcount64(uint64_t bits)
{
    bits -= bits >> 1 & 0x5555555555555555u;
    bits = (bits & 0x3333333333333333u) + (bits >> 2 & 0x3333333333333333u);
    bits = (bits + (bits >> 4)) & 0x0F0F0F0F0F0F0F0Fu;
    return (bits * 0x0101010101010101u) >> 56;
}

static inline uint64_t
mask16(__m128i matches, int part)
{
    return (uint64_t)(unsigned)_mm_movemask_epi8(matches) << (16 * part);
}

typedef struct {
    uint64_t quote, bracket, backslash, scalar; /* bit i: byte i is one */
} Block;

static inline void
classify_block(const uint8_t *p, Block *block)
{
    uint64_t quote = 0, bracket = 0, backslash = 0, blank = 0;
    for (int part = 0; part < 4; part++) {
        __m128i bytes = _mm_loadu_si128((const __m128i *)(p + 16 * part));
        __m128i folded = _mm_or_si128(bytes, _mm_set1_epi8(0x20)); /* '[' -> '{', ']' -> '}' */
        __m128i blanks = _mm_or_si128(
            _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_set1_epi8(' ')),
                                      _mm_cmpeq_epi8(bytes, _mm_set1_epi8('\t'))),
                         _mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_set1_epi8('\n')),
                                      _mm_cmpeq_epi8(bytes, _mm_set1_epi8('\r')))),
            _mm_or_si128(_mm_cmpeq_epi8(bytes, _mm_set1_epi8(',')),
                         _mm_cmpeq_epi8(bytes, _mm_set1_epi8(':'))));
        quote |= mask16(_mm_cmpeq_epi8(bytes, _mm_set1_epi8('"')), part);
        bracket |= mask16(_mm_or_si128(_mm_cmpeq_epi8(folded, _mm_set1_epi8('{')),
                                       _mm_cmpeq_epi8(folded, _mm_set1_epi8('}'))),
                          part);
        backslash |= mask16(_mm_cmpeq_epi8(bytes, _mm_set1_epi8('\\')), part);
        blank |= mask16(blanks, part);
    }
    block->quote = quote;
    block->bracket = bracket;
    block->backslash = backslash;
    block->scalar = ~(quote | bracket | blank);
}

/* One block at *pp that holds no backslash and starts outside a string. */
static int
scan_json_block(JsonScan *scan, const uint8_t **pp, const uint8_t *end, const Block *block)
{
    uint64_t inside = block->quote; /* bit i: byte i is an opening quote or in a string */
    if (inside) {
        inside ^= inside << 1;
        inside ^= inside << 2;
        inside ^= inside << 4;
        inside ^= inside << 8;
        inside ^= inside << 16;
        inside ^= inside << 32;
    }
    uint64_t outside = ~inside;
    int open_at = -1; /* the quote of a string still open at the end of the block */
    if (inside >> 63) {
        open_at = 63 - __builtin_clzll(block->quote & inside);
        outside &= ((uint64_t)1 << open_at) - 1;
    }
    /* counted without order: a closing quote (a string) and the first byte of a scalar run */
    uint64_t counted =
        (block->quote | (block->scalar & ~(block->scalar << 1 | scan->in_scalar))) & outside;
    uint64_t brackets = block->bracket & outside;
    while (brackets) { /* in order: the depth changes here */
        int at = __builtin_ctzll(brackets);
        uint64_t before = ((uint64_t)1 << at) - 1;
        scan->elements += popcount64(counted & before);
        if (scan->elements > scan->max_elements) {
            return SCAN_BUDGET;
        }
        counted &= ~before;
        brackets &= brackets - 1;
        if ((*pp)[at] & 0x02) { /* '[' 5b, '{' 7b; not ']' 5d, '}' 7d */
            if (++scan->depth > scan->max_depth) {
                return SCAN_DEPTH;
            }
            if (++scan->elements > scan->max_elements) {
                return SCAN_BUDGET;
            }
        }
        else {
            scan->depth -= scan->depth > 0;
        }
    }
    scan->elements += popcount64(counted);
    if (scan->elements > scan->max_elements) {
        return SCAN_BUDGET;
    }
    if (open_at >= 0) {
        const uint8_t *p = skip_string(*pp + open_at + 1, end);
        if (p == NULL) {
            return SCAN_STOP;
        }
        if (++scan->elements > scan->max_elements) {
            return SCAN_BUDGET;
        }
        scan->in_scalar = 0;
        *pp = p;
    }
    else {
        scan->in_scalar = (unsigned)(block->scalar >> 63);
        *pp += JSON_BLOCK;
    }
    return SCAN_OK;
}
#endif

static int
scan_json(const uint8_t *p, const uint8_t *end, uint64_t max_depth, uint64_t max_elements)
{
    JsonScan scan = {0, 0, max_depth, max_elements, 0};
    int result = SCAN_OK;
#ifdef JSON_BLOCK
    while (result == SCAN_OK && end - p >= JSON_BLOCK) {
        Block block;
        classify_block(p, &block);
        result = block.backslash ? scan_json_bytes(&scan, &p, p + JSON_BLOCK, end)
                                 : scan_json_block(&scan, &p, end, &block);
    }
#endif
    if (result == SCAN_OK) {
        result = scan_json_bytes(&scan, &p, end, end);
    }
    return result == SCAN_STOP ? SCAN_OK : result;
}

/* ---- MessagePack ---------------------------------------------------------------------------- */

/* What follows a format byte of 0xc0..0xdf (the MessagePack spec's "Overview" table). For
 * M_FIXED, size is the payload's bytes; for the others, the bytes of the length or count
 * field. The fix* ranges (0x00..0xbf, 0xe0..0xff) are decoded from the byte itself. */
enum { M_FIXED, M_BYTES, M_EXT, M_ARRAY, M_MAP, M_NEVER };

static const struct {
    uint8_t kind, size;
} FORMATS[32] = {
    {M_FIXED, 0},  {M_NEVER, 0},  {M_FIXED, 0}, {M_FIXED, 0}, /* nil, (never used), false, true */
    {M_BYTES, 1},  {M_BYTES, 2},  {M_BYTES, 4},               /* bin 8/16/32 */
    {M_EXT, 1},    {M_EXT, 2},    {M_EXT, 4},                 /* ext 8/16/32 */
    {M_FIXED, 4},  {M_FIXED, 8},                              /* float 32/64 */
    {M_FIXED, 1},  {M_FIXED, 2},  {M_FIXED, 4}, {M_FIXED, 8}, /* uint 8..64 */
    {M_FIXED, 1},  {M_FIXED, 2},  {M_FIXED, 4}, {M_FIXED, 8}, /* int 8..64 */
    {M_FIXED, 2},  {M_FIXED, 3},  {M_FIXED, 5}, {M_FIXED, 9}, /* fixext 1/2/4/8: type + data */
    {M_FIXED, 17},                                            /* fixext 16 */
    {M_BYTES, 1},  {M_BYTES, 2},  {M_BYTES, 4},               /* str 8/16/32 */
    {M_ARRAY, 2},  {M_ARRAY, 4},  {M_MAP, 2},   {M_MAP, 4},   /* array 16/32, map 16/32 */
};

static inline uint64_t
read_be(const uint8_t *p, int size)
{
    uint64_t value = 0;
    for (int i = 0; i < size; i++) {
        value = value << 8 | p[i];
    }
    return value;
}

typedef struct {
    uint64_t *owed; /* per open container, outermost first: children not yet read (> 0) */
    size_t depth;
    size_t cap;
    uint64_t small[SMALL_STACK];
} Stack;

static int
stack_push(Stack *stack, uint64_t children)
{
    if (stack->depth == stack->cap) {
        if (stack->cap > PY_SSIZE_T_MAX / 2 / sizeof(uint64_t)) {
            PyErr_NoMemory();
            return -1;
        }
        size_t cap = stack->cap * 2;
        uint64_t *owed;
        if (stack->owed == stack->small) {
            owed = PyMem_Malloc(cap * sizeof(uint64_t));
            if (owed != NULL) {
                memcpy(owed, stack->small, sizeof(stack->small));
            }
        }
        else {
            owed = PyMem_Realloc(stack->owed, cap * sizeof(uint64_t));
        }
        if (owed == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        stack->owed = owed;
        stack->cap = cap;
    }
    stack->owed[stack->depth++] = children;
    return 0;
}

static int
walk_msgpack(const uint8_t *data, size_t size, uint64_t max_depth, uint64_t max_elements,
             Stack *stack)
{
    if (size == 0) {
        return SCAN_OK;
    }
    if (max_elements < 1) {
        return SCAN_BUDGET; /* the top-level object */
    }
    uint64_t elements = 1;
    size_t pos = 0;
    for (;;) {
        if (pos >= size) {
            return SCAN_OK; /* truncated */
        }
        uint8_t byte = data[pos++];
        size_t left = size - pos;
        uint64_t skip = 0;     /* payload bytes to pass over */
        uint64_t children = 0; /* of a container */
        int container = 0;
        if (byte < 0x80 || byte >= 0xe0) {
            /* positive or negative fixint */
        }
        else if (byte < 0x90) {
            container = 1; /* fixmap */
            children = 2 * (uint64_t)(byte & 0x0f);
        }
        else if (byte < 0xa0) {
            container = 1; /* fixarray */
            children = byte & 0x0f;
        }
        else if (byte < 0xc0) {
            skip = byte & 0x1f; /* fixstr */
        }
        else {
            int kind = FORMATS[byte - 0xc0].kind, field = FORMATS[byte - 0xc0].size;
            if (kind == M_NEVER) {
                return SCAN_OK;
            }
            if (kind == M_FIXED) {
                skip = (uint64_t)field;
            }
            else {
                if ((size_t)field > left) {
                    return SCAN_OK;
                }
                uint64_t length = read_be(data + pos, field);
                pos += (size_t)field;
                left -= (size_t)field;
                switch (kind) {
                case M_BYTES:
                    skip = length;
                    break;
                case M_EXT:
                    skip = length + 1; /* the type byte, then the data */
                    break;
                case M_ARRAY:
                    container = 1;
                    children = length;
                    break;
                default: /* M_MAP */
                    container = 1;
                    children = 2 * length;
                    break;
                }
            }
        }
        if (container) {
            if ((uint64_t)stack->depth + 1 > max_depth) {
                return SCAN_DEPTH;
            }
            elements += children; /* <= 2**62 + 2**33: no overflow */
            if (elements > max_elements) {
                return SCAN_BUDGET;
            }
            if (children > 0) {
                if (stack_push(stack, children) < 0) {
                    return SCAN_ERROR;
                }
                continue; /* its first child is next */
            }
        }
        else {
            if (skip > (uint64_t)left) {
                return SCAN_OK; /* a payload past the end */
            }
            pos += (size_t)skip;
        }
        /* a value is complete: it pays one child of its parent, which may complete it too */
        for (;;) {
            if (stack->depth == 0) {
                return SCAN_OK; /* the top-level object; what follows is the parser's */
            }
            if (--stack->owed[stack->depth - 1] > 0) {
                break;
            }
            stack->depth--;
        }
    }
}

static int
scan_msgpack(const uint8_t *data, size_t size, uint64_t max_depth, uint64_t max_elements)
{
    Stack stack;
    stack.owed = stack.small;
    stack.depth = 0;
    stack.cap = SMALL_STACK;
    int result = walk_msgpack(data, size, max_depth, max_elements, &stack);
    if (stack.owed != stack.small) {
        PyMem_Free(stack.owed);
    }
    return result;
}

/* ---- the Python functions ------------------------------------------------------------------- */

/* A limit as a uint64_t: at least minimum (else ValueError), clamped to MAX_LIMIT. */
static int
read_limit(PyObject *arg, long long minimum, const char *name, uint64_t *out)
{
    int overflow;
    long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow < 0 || (overflow == 0 && value < minimum)) {
        PyErr_Format(PyExc_ValueError, "%s must be at least %lld", name, minimum);
        return -1;
    }
    *out = overflow > 0 || (uint64_t)value > MAX_LIMIT ? MAX_LIMIT : (uint64_t)value;
    return 0;
}

static void
raise_limit(PyObject *cls, PyObject *limit)
{
    PyObject *exc = PyObject_CallOneArg(cls, limit);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
}

typedef int (*Scanner)(const uint8_t *, size_t, uint64_t, uint64_t);

static int
scan_json_buffer(const uint8_t *data, size_t size, uint64_t max_depth, uint64_t max_elements)
{
    return scan_json(data, data + size, max_depth, max_elements);
}

static PyObject *
check(Scanner scanner, const char *name, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "%s(data, max_depth, max_elements) takes 3 arguments",
                     name);
        return NULL;
    }
    if (require_configured(S.depth_error != NULL, "_scan") < 0) {
        return NULL;
    }
    uint64_t max_depth, max_elements;
    if (read_limit(args[1], 1, "max_depth", &max_depth) < 0 ||
        read_limit(args[2], 0, "max_elements", &max_elements) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int result = scanner((const uint8_t *)view.buf, (size_t)view.len, max_depth, max_elements);
    PyBuffer_Release(&view);
    switch (result) {
    case SCAN_OK:
        Py_RETURN_NONE;
    case SCAN_DEPTH:
        raise_limit(S.depth_error, args[1]);
        return NULL;
    case SCAN_BUDGET:
        raise_limit(S.budget_error, args[2]);
        return NULL;
    default:
        return NULL;
    }
}

PyDoc_STRVAR(check_json_doc,
             "check_json(data, max_depth, max_elements, /)\n--\n\n"
             "Raise DepthLimitError or ElementBudgetError if the JSON text in data (any "
             "C-contiguous buffer) nests deeper than max_depth or holds more than max_elements "
             "elements; else return None. See inferwire.codecs.scan.");

static PyObject *
check_json(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return check(scan_json_buffer, "check_json", args, nargs);
}

PyDoc_STRVAR(check_msgpack_doc,
             "check_msgpack(data, max_depth, max_elements, /)\n--\n\n"
             "Raise DepthLimitError or ElementBudgetError if the MessagePack object at the "
             "start of data nests deeper than max_depth or declares more than max_elements "
             "elements; else return None. See inferwire.codecs.scan.");

static PyObject *
check_msgpack(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    return check(scan_msgpack, "check_msgpack", args, nargs);
}

static PyMethodDef methods[] = {
    {"configure", FASTCALL(configure), METH_FASTCALL,
     "configure(DepthLimitError, ElementBudgetError, /)\n--\n\n"
     "Bind the exception classes the checks raise; call once before them."},
    {"check_json", FASTCALL(check_json), METH_FASTCALL, check_json_doc},
    {"check_msgpack", FASTCALL(check_msgpack), METH_FASTCALL, check_msgpack_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.codecs._scan",
    .m_doc = "Depth and element limits checked before parsing (see codecs/scan.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return module_with_version(&module_def, API_VERSION);
}
