/* _flatbuffers_accel: the FlatBuffers codec's encoder for schemas/inferwire.fbs, compiled.
 *
 * Why not the official runtime: flatbuffers.Builder is pure Python, one method call and one
 * struct.pack per scalar, and that, not the format, made encoding 20-30x protobuf's. There is
 * no maintained C encoder for Python objects to call instead (flatc's C++ needs a C++ object
 * model and a copy into it), so this one writes our schema, and nothing else, from the model
 * objects of codecs/model.py.
 *
 * The layout is the reference's, byte for byte: the same steps as flatbuffers.Builder (Prep's
 * alignment from the end of the buffer, vtables shared when the Python builder shares them,
 * FinishSizePrefixed with the identifier "IWF1") in the order codecs/flatbuffers_codec.py
 * calls them. tests/test_flatbuffers_fast.py checks the bytes are equal, so the verifier, the
 * views and other languages' readers see one layout whichever path wrote it.
 *
 * A small message (a token chunk) is built in a buffer on the stack and copied out. A larger
 * one takes two passes: the first measures (the same steps, nothing written), the second
 * writes into a bytes object of exactly that size, back to front, so a tensor's bytes are
 * copied once, into the output (the Python builder copies them twice).
 *
 * What it takes: messages of exactly the model types, with fields of exactly the types the
 * model declares (str, int, float or a subclass of float such as numpy.float64, tuple or list,
 * the model classes, C-contiguous numpy arrays of the datatype's dtype). Anything else (a subclass, a value the reference refuses, a BYTES
 * tensor, a string with a lone surrogate, an integer out of its field's range) is handed back:
 * encode() returns None, having changed nothing, and the Python reference encodes it or raises
 * its typed error. The only exceptions raised here are MemoryError and TypeError for a call
 * without configure().
 *
 * No Python code runs during an encode: fields are read through their slots, types are
 * checked exactly, strings are encoded to UTF-8 here (no cache is attached to the str), and
 * nothing GC-tracked is allocated. So the message cannot change between the two passes.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY */

#include <stdint.h>
#include <string.h>

#include "_extension.h"
#include "_model_slots.h"

/* Bumped when an argument list changes: flatbuffers_codec ignores a stale build. */
#define API_VERSION 1

/* FLATBUFFERS_MAX_BUFFER_SIZE: offsets are 32-bit signed. Larger goes to the reference, which
 * raises its BuilderSizeError. */
#define MAX_BUFFER ((Py_ssize_t)0x7FFFFFFF)
/* DATA_ALIGNMENT in flatbuffers_codec.py: tensor data and embedding vectors. */
#define DATA_ALIGNMENT 16
#define MAX_SLOTS 10
#define SMALL 32
#define SCRATCH_BYTES 4096

/* union Payload's values, in the order of the .fbs (0 is NONE). */
enum { PAYLOAD_TOKEN_CHUNK = 1, PAYLOAD_EMBEDDING_BATCH, PAYLOAD_INFER_REQUEST,
       PAYLOAD_INFER_RESPONSE };

/* ---- the model classes, read through their slots ------------------------------------------ */

enum { E_MODEL, E_VECTORS, E_USAGE, E_FIELDS };
enum { X_NAME, X_DATATYPE, X_SHAPE, X_DATA, X_FIELDS };
enum { R_MODEL, R_ID, R_TENSORS, R_FIELDS };

static const char *const EMBEDDING_FIELDS[E_FIELDS] = {"model", "vectors", "usage"};
static const char *const TENSOR_FIELDS[X_FIELDS] = {"name", "datatype", "shape", "data"};
static const char *const REQUEST_FIELDS[R_FIELDS] = {"model", "id", "inputs"};
static const char *const RESPONSE_FIELDS[R_FIELDS] = {"model", "id", "outputs"};


static struct {
    int configured;
    ModelClass chunk, logprob, top, usage, embedding, tensor, request, response;
    PyTypeObject *ndarray;
} S;

/* A field of a model object: a borrowed reference, NULL if never set. */
#define FIELD(obj, cls, field) (*(PyObject **)((char *)(obj) + S.cls.offsets[field]))

/* ---- the builder ---------------------------------------------------------------------------- */

/* One vtable written so far, kept whole in `keys`: it holds what flatbuffers.Builder.WriteVtable
 * keys its dict by (the field offsets up to the last present one, and the object's size). */
typedef struct {
    Py_ssize_t key_at;
    Py_ssize_t key_len;
    Py_ssize_t offset; /* the builder's Offset() after writing it */
} Vtable;

typedef struct {
    uint8_t *buf;   /* NULL while measuring */
    Py_ssize_t cap; /* the output's size, when writing */
    Py_ssize_t off; /* bytes written, counted from the end: flatbuffers.Builder.Offset() */
    Py_ssize_t minalign;
    int overrun; /* writing: a step would write before the start (a bug): the result is dropped */
    /* the table being built */
    Py_ssize_t slots[MAX_SLOTS];
    int nslots;
    Py_ssize_t object_end;
    /* the vtables written so far */
    Vtable *vtables;
    Py_ssize_t nvtables, vtables_cap;
    uint16_t *keys;
    Py_ssize_t nkeys, keys_cap;
    /* room for the workloads' messages (at most 6 vtables of 33 entries in all); more on the heap */
    Vtable vtables_small[6];
    uint16_t keys_small[34];
} Builder;

static void
builder_init(Builder *b, uint8_t *buf, Py_ssize_t cap)
{
    b->buf = buf;
    b->cap = cap;
    b->off = 0;
    b->minalign = 1;
    b->overrun = 0;
    b->nslots = 0;
    b->object_end = 0;
    b->vtables = b->vtables_small;
    b->nvtables = 0;
    b->vtables_cap = (Py_ssize_t)(sizeof(b->vtables_small) / sizeof(b->vtables_small[0]));
    b->keys = b->keys_small;
    b->nkeys = 0;
    b->keys_cap = (Py_ssize_t)(sizeof(b->keys_small) / sizeof(b->keys_small[0]));
}

static void
builder_free(Builder *b)
{
    if (b->vtables != b->vtables_small) {
        PyMem_Free(b->vtables);
    }
    if (b->keys != b->keys_small) {
        PyMem_Free(b->keys);
    }
    b->vtables = b->vtables_small;
    b->keys = b->keys_small;
}

/* memcpy of a few bytes without a call into libc: a token chunk's strings and vtables are
 * 2-40 bytes, and nine calls to memcpy were a tenth of its encode. */
static inline void
copy_bytes(uint8_t *to, const void *from_, Py_ssize_t n)
{
    const uint8_t *from = from_;
    if (n > 64) {
        memcpy(to, from, (size_t)n);
    }
    else if (n >= 8) {
        uint64_t word;
        for (Py_ssize_t i = 0; i + 8 <= n; i += 8) {
            memcpy(&word, from + i, 8);
            memcpy(to + i, &word, 8);
        }
        memcpy(&word, from + n - 8, 8); /* the last 8, overlapping what is copied */
        memcpy(to + n - 8, &word, 8);
    }
    else if (n >= 4) {
        uint32_t head, tail;
        memcpy(&head, from, 4);
        memcpy(&tail, from + n - 4, 4);
        memcpy(to, &head, 4);
        memcpy(to + n - 4, &tail, 4);
    }
    else if (n >= 2) {
        uint16_t head, tail;
        memcpy(&head, from, 2);
        memcpy(&tail, from + n - 2, 2);
        memcpy(to, &head, 2);
        memcpy(to + n - 2, &tail, 2);
    }
    else if (n == 1) {
        to[0] = from[0];
    }
}

/* Room for n more bytes; when writing, where they go. Over 2 GiB: hand back. */
static inline int
reserve(Builder *b, Py_ssize_t n, uint8_t **at)
{
    if (n > MAX_BUFFER - b->off) {
        return STEP_BAIL;
    }
    b->off += n;
    *at = NULL;
    if (b->buf != NULL) {
        if (b->off > b->cap) {
            b->overrun = 1;
            return STEP_BAIL;
        }
        *at = b->buf + (b->cap - b->off);
    }
    return STEP_OK;
}

static inline int
pad(Builder *b, Py_ssize_t n)
{
    uint8_t *at;
    TRY(reserve(b, n, &at));
    if (at != NULL) {
        /* at most 15 bytes (DATA_ALIGNMENT - 1): a loop, not a call */
        for (Py_ssize_t i = 0; i < n; i++) {
            at[i] = 0;
        }
    }
    return STEP_OK;
}

/* Builder.Prep: align so that after `additional` bytes an element of `size` is aligned. */
static inline int
prep(Builder *b, Py_ssize_t size, Py_ssize_t additional)
{
    if (size > b->minalign) {
        b->minalign = size;
    }
    if (additional > MAX_BUFFER - b->off) {
        return STEP_BAIL;
    }
    return pad(b, (-(b->off + additional)) & (size - 1));
}

/* Builder.Place: little-endian (the module refuses a big-endian host). */
static inline int
place(Builder *b, const void *value, Py_ssize_t size)
{
    uint8_t *at;
    TRY(reserve(b, size, &at));
    if (at != NULL) {
        copy_bytes(at, value, size);
    }
    return STEP_OK;
}

static inline int
place_u32(Builder *b, uint32_t v)
{
    return place(b, &v, 4);
}

/* Builder.Prepend: Prep then Place. */
static inline int
prepend(Builder *b, const void *value, Py_ssize_t size)
{
    TRY(prep(b, size, 0));
    return place(b, value, size);
}

/* Builder.PrependUOffsetTRelative. */
static inline int
prepend_uoffset(Builder *b, Py_ssize_t target)
{
    TRY(prep(b, 4, 0));
    return place_u32(b, (uint32_t)(b->off - target + 4));
}

static inline void
start_object(Builder *b, int nslots)
{
    b->nslots = nslots;
    /* a loop, not memset: the compiler's `rep stos` for 80 bytes cost more than the table */
    for (int i = 0; i < nslots; i++) {
        b->slots[i] = 0;
    }
    b->object_end = b->off;
}

static inline void
slot(Builder *b, int index)
{
    b->slots[index] = b->off;
}

/* The generated Add* of a scalar: PrependSlot, which leaves out the default (0). */
static inline int
scalar_slot(Builder *b, int index, const void *value, Py_ssize_t size, int is_default)
{
    if (is_default) {
        return STEP_OK;
    }
    TRY(prepend(b, value, size));
    slot(b, index);
    return STEP_OK;
}

/* The generated Add* of an offset: PrependUOffsetTRelativeSlot, which leaves out 0. */
static inline int
offset_slot(Builder *b, int index, Py_ssize_t target)
{
    if (target == 0) {
        return STEP_OK;
    }
    TRY(prepend_uoffset(b, target));
    slot(b, index);
    return STEP_OK;
}

/* flatbuffers_codec._add_float: a double always written (0.0 too: -0.0 keeps its sign). */
static inline int
float_slot(Builder *b, int index, double value)
{
    TRY(prepend(b, &value, 8));
    slot(b, index);
    return STEP_OK;
}

static int
remember_vtable(Builder *b, const uint16_t *key, Py_ssize_t key_len)
{
    if (b->nvtables == b->vtables_cap) {
        Py_ssize_t cap = b->vtables_cap * 2;
        Vtable *grown = PyMem_Malloc((size_t)cap * sizeof(Vtable));
        if (grown == NULL) {
            PyErr_NoMemory();
            return STEP_ERROR;
        }
        memcpy(grown, b->vtables, (size_t)b->nvtables * sizeof(Vtable));
        if (b->vtables != b->vtables_small) {
            PyMem_Free(b->vtables);
        }
        b->vtables = grown;
        b->vtables_cap = cap;
    }
    if (b->nkeys + key_len > b->keys_cap) {
        Py_ssize_t cap = (b->keys_cap + key_len) * 2;
        uint16_t *grown = PyMem_Malloc((size_t)cap * sizeof(uint16_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return STEP_ERROR;
        }
        memcpy(grown, b->keys, (size_t)b->nkeys * sizeof(uint16_t));
        if (b->keys != b->keys_small) {
            PyMem_Free(b->keys);
        }
        b->keys = grown;
        b->keys_cap = cap;
    }
    for (Py_ssize_t i = 0; i < key_len; i++) {
        b->keys[b->nkeys + i] = key[i];
    }
    b->vtables[b->nvtables].key_at = b->nkeys;
    b->vtables[b->nvtables].key_len = key_len;
    b->vtables[b->nvtables].offset = b->off;
    b->nvtables++;
    b->nkeys += key_len;
    return STEP_OK;
}

/* Builder.EndObject (WriteVtable): the table's soffset, then its vtable unless an identical
 * one was written before. *out: the table's offset. */
static int
end_object(Builder *b, Py_ssize_t *out)
{
    TRY(prep(b, 4, 0));
    /* a placeholder, as PrependSOffsetTRelative(0) writes; patched below */
    TRY(place_u32(b, (uint32_t)(b->off + 4)));
    Py_ssize_t object = b->off;
    Py_ssize_t object_size = object - b->object_end;
    if (object_size > 0xFFFF) {
        return STEP_BAIL; /* cannot happen in this schema; the reference raises */
    }
    /* The vtable as it is written: its size, the object's size, then each field's offset up
     * to the last present one (0: absent). It is also the key WriteVtable looks vtables up by
     * (the offsets and the object's size; the vtable's size counts the offsets). */
    uint16_t vtable[MAX_SLOTS + 2];
    int used = 0;
    for (int i = 0; i < b->nslots; i++) {
        Py_ssize_t at = b->slots[i];
        vtable[2 + i] = at ? (uint16_t)(object - at) : 0;
        if (at) {
            used = i + 1;
        }
    }
    Py_ssize_t vtable_len = used + 2;
    vtable[0] = (uint16_t)(vtable_len * 2);
    vtable[1] = (uint16_t)object_size;
    Py_ssize_t found = -1;
    for (Py_ssize_t v = 0; v < b->nvtables && found < 0; v++) {
        const Vtable *vt = &b->vtables[v];
        if (vt->key_len != vtable_len) {
            continue;
        }
        /* a loop, not memcmp: vtables are 2-12 entries, and a logprob's top tables look up
         * the same one 5 times */
        const uint16_t *other = b->keys + vt->key_at;
        Py_ssize_t i = 0;
        while (i < vtable_len && other[i] == vtable[i]) {
            i++;
        }
        if (i == vtable_len) {
            found = vt->offset;
        }
    }
    int32_t soffset;
    if (found < 0) {
        /* WriteVtable prepends the field offsets from the last, then the object's size and
         * the vtable's size, each a uint16 after Prep(2): the soffset just written left the
         * buffer 4-aligned, so no Prep pads and the vtable is one block. */
        TRY(prep(b, 2, 0));
        TRY(place(b, vtable, vtable_len * 2));
        soffset = (int32_t)(b->off - object);
        TRY(remember_vtable(b, vtable, vtable_len));
    }
    else {
        soffset = (int32_t)(found - object);
    }
    if (b->buf != NULL) {
        memcpy(b->buf + (b->cap - object), &soffset, 4);
    }
    b->nslots = 0;
    *out = object;
    return STEP_OK;
}

/* Builder.StartVector, the elements' bytes, EndVector: a vector of `count` elements whose
 * bytes `write` fills (or of raw bytes from `raw`, when write is NULL). */
typedef void (*FillFn)(uint8_t *at, const void *source, Py_ssize_t count);

static int
raw_vector(Builder *b, Py_ssize_t elem_size, Py_ssize_t count, Py_ssize_t alignment,
           FillFn fill, const void *source, Py_ssize_t *out)
{
    Py_ssize_t nbytes = elem_size * count;
    TRY(prep(b, 4, nbytes));
    TRY(prep(b, alignment, nbytes));
    uint8_t *at;
    TRY(reserve(b, nbytes, &at));
    if (at != NULL && nbytes) {
        if (fill != NULL) {
            fill(at, source, count);
        }
        else {
            memcpy(at, source, (size_t)nbytes);
        }
    }
    TRY(place_u32(b, (uint32_t)count));
    *out = b->off;
    return STEP_OK;
}

/* A vector of offsets (flatbuffers_codec._offset_vector): StartVector(4, n, 4), each offset
 * prepended from the last, EndVector. */
static int
offset_vector(Builder *b, const Py_ssize_t *offsets, Py_ssize_t count, Py_ssize_t *out)
{
    TRY(prep(b, 4, 4 * count));
    TRY(prep(b, 4, 4 * count));
    for (Py_ssize_t i = count - 1; i >= 0; i--) {
        TRY(prepend_uoffset(b, offsets[i]));
    }
    TRY(place_u32(b, (uint32_t)count));
    *out = b->off;
    return STEP_OK;
}

/* ---- values of the model ---------------------------------------------------------------------- */

/* The UTF-8 length of an exact str, or -1 if it has a surrogate (the reference's encode refuses
 * it: hand back). */
static Py_ssize_t
utf8_length(PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        return n;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            total += 1;
        }
        else if (c < 0x800) {
            total += 2;
        }
        else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF) {
                return -1;
            }
            total += 3;
        }
        else {
            total += 4;
        }
    }
    return total;
}

static void
utf8_write(uint8_t *at, PyObject *s)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (PyUnicode_IS_ASCII(s)) {
        copy_bytes(at, PyUnicode_DATA(s), n);
        return;
    }
    int kind = PyUnicode_KIND(s);
    const void *data = PyUnicode_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            *at++ = (uint8_t)c;
        }
        else if (c < 0x800) {
            *at++ = (uint8_t)(0xC0 | (c >> 6));
            *at++ = (uint8_t)(0x80 | (c & 0x3F));
        }
        else if (c < 0x10000) {
            *at++ = (uint8_t)(0xE0 | (c >> 12));
            *at++ = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
            *at++ = (uint8_t)(0x80 | (c & 0x3F));
        }
        else {
            *at++ = (uint8_t)(0xF0 | (c >> 18));
            *at++ = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
            *at++ = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
            *at++ = (uint8_t)(0x80 | (c & 0x3F));
        }
    }
}

/* Builder.CreateString of an exact str (flatbuffers_codec._string). */
static int
string(Builder *b, PyObject *s, Py_ssize_t *out)
{
    if (s == NULL || !PyUnicode_CheckExact(s)) {
        return STEP_BAIL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(s) < 0) {
        return STEP_ERROR;
    }
#endif
    Py_ssize_t length = utf8_length(s);
    if (length < 0) {
        return STEP_BAIL;
    }
    /* CreateString: Prep(4, length + 1), the 0 terminator, the bytes, the uint32 length;
     * as one block: the length, the bytes, the terminator, then Prep's padding */
    if (length > MAX_BUFFER - 8) { /* the length, the terminator, at most 3 bytes' padding */
        return STEP_BAIL;
    }
    Py_ssize_t padding = (-(b->off + length + 1)) & 3;
    if (b->minalign < 4) {
        b->minalign = 4;
    }
    uint8_t *at;
    TRY(reserve(b, 4 + length + 1 + padding, &at));
    if (at != NULL) {
        uint32_t n = (uint32_t)length;
        memcpy(at, &n, 4);
        utf8_write(at + 4, s);
        for (Py_ssize_t i = 0; i <= padding; i++) {
            at[4 + length + i] = 0;
        }
    }
    *out = b->off;
    return STEP_OK;
}

/* flatbuffers_codec._text: a string left out (0) when empty. */
static int
text(Builder *b, PyObject *s, Py_ssize_t *out)
{
    if (s != NULL && PyUnicode_CheckExact(s) && PyUnicode_GET_LENGTH(s) == 0) {
        *out = 0;
        return STEP_OK;
    }
    return string(b, s, out);
}

/* The value of a small exact int (token ids, indexes, counts, timestamps), read from the
 * object; 0 for a larger one, which the caller converts by the API. */
static inline int
small_int(PyObject *value, int64_t *out)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)value)) {
        *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)value);
        return 1;
    }
    return 0;
#else
    /* up to two 30-bit digits: a timestamp (`created`) has two */
    Py_ssize_t size = Py_SIZE(value);
    const digit *digits = ((PyLongObject *)value)->ob_digit;
    switch (size) {
    case 0:
        *out = 0;
        return 1;
    case 1:
    case -1:
        *out = size * (int64_t)digits[0];
        return 1;
    case 2:
    case -2:
        *out = (size / 2) * ((int64_t)digits[0] | ((int64_t)digits[1] << PyLong_SHIFT));
        return 1;
    default:
        return 0;
    }
#endif
}

/* An exact int in [low, high] (int64 range), else hand back. */
static int
int_in(PyObject *value, int64_t low, int64_t high, int64_t *out)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        return STEP_BAIL;
    }
    int64_t small;
    if (small_int(value, &small)) {
        if (small < low || small > high) {
            return STEP_BAIL;
        }
        *out = small;
        return STEP_OK;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return STEP_ERROR;
    }
    if (overflow || v < low || v > high) {
        return STEP_BAIL;
    }
    *out = (int64_t)v;
    return STEP_OK;
}

/* An exact int in [0, 2**64). */
static int
uint64_of(PyObject *value, uint64_t *out)
{
    if (value == NULL || !PyLong_CheckExact(value)) {
        return STEP_BAIL;
    }
    int64_t small;
    if (small_int(value, &small)) {
        if (small < 0) {
            return STEP_BAIL;
        }
        *out = (uint64_t)small;
        return STEP_OK;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(value);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return STEP_ERROR;
        }
        PyErr_Clear(); /* negative or too large: the reference's error */
        return STEP_BAIL;
    }
    *out = (uint64_t)v;
    return STEP_OK;
}

static int
uint32_of(PyObject *value, uint32_t *out)
{
    int64_t v;
    TRY(int_in(value, 0, UINT32_MAX, &v));
    *out = (uint32_t)v;
    return STEP_OK;
}

/* A float, or a float subclass (numpy.float64): its stored value, as struct.pack reads it. */
static int
double_of(PyObject *value, double *out)
{
    if (value == NULL || !PyFloat_Check(value)) {
        return STEP_BAIL;
    }
    *out = PyFloat_AS_DOUBLE(value);
    return STEP_OK;
}

/* An exact tuple or list: its items, borrowed (no Python code runs while they are used). */
static int
items_of(PyObject *seq, PyObject ***items, Py_ssize_t *count)
{
    if (seq == NULL || !(PyTuple_CheckExact(seq) || PyList_CheckExact(seq))) {
        return STEP_BAIL;
    }
    *items = PySequence_Fast_ITEMS(seq);
    *count = PySequence_Fast_GET_SIZE(seq);
    return STEP_OK;
}

/* Room for `count` offsets: `small` or the heap (freed by the caller when != small). */
static int
offsets_room(Py_ssize_t count, Py_ssize_t *small, Py_ssize_t **out)
{
    if (count <= SMALL) {
        *out = small;
        return STEP_OK;
    }
    *out = PyMem_Malloc((size_t)count * sizeof(Py_ssize_t));
    if (*out == NULL) {
        PyErr_NoMemory();
        return STEP_ERROR;
    }
    return STEP_OK;
}

/* ---- the tables ------------------------------------------------------------------------------ */

static int
usage_table(Builder *b, PyObject *usage, Py_ssize_t *out)
{
    if (usage == Py_None) {
        *out = 0;
        return STEP_OK;
    }
    if (usage == NULL || !Py_IS_TYPE(usage, S.usage.type)) {
        return STEP_BAIL;
    }
    uint32_t prompt, completion;
    TRY(uint32_of(FIELD(usage, usage, U_PROMPT), &prompt));
    TRY(uint32_of(FIELD(usage, usage, U_COMPLETION), &completion));
    start_object(b, 2);
    TRY(scalar_slot(b, 0, &prompt, 4, prompt == 0));
    TRY(scalar_slot(b, 1, &completion, 4, completion == 0));
    return end_object(b, out);
}

static int
top_table(Builder *b, PyObject *top, Py_ssize_t *out)
{
    if (!Py_IS_TYPE(top, S.top.type)) {
        return STEP_BAIL;
    }
    double logprob;
    Py_ssize_t token;
    TRY(double_of(FIELD(top, top, T_LOGPROB), &logprob));
    TRY(string(b, FIELD(top, top, T_TOKEN), &token));
    start_object(b, 2);
    TRY(offset_slot(b, 0, token));
    TRY(float_slot(b, 1, logprob));
    return end_object(b, out);
}

static int
logprob_tops(Builder *b, PyObject **tops, Py_ssize_t count, Py_ssize_t *offsets,
             Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        TRY(top_table(b, tops[i], &offsets[i]));
    }
    return offset_vector(b, offsets, count, out);
}

static int
logprob_table(Builder *b, PyObject *lp, Py_ssize_t *out)
{
    if (!Py_IS_TYPE(lp, S.logprob.type)) {
        return STEP_BAIL;
    }
    double logprob;
    PyObject **tops;
    Py_ssize_t ntops, top_vector = 0, token;
    TRY(double_of(FIELD(lp, logprob, L_LOGPROB), &logprob));
    TRY(items_of(FIELD(lp, logprob, L_TOP), &tops, &ntops));
    if (ntops) {
        Py_ssize_t small[SMALL], *offsets;
        TRY(offsets_room(ntops, small, &offsets));
        int result = logprob_tops(b, tops, ntops, offsets, &top_vector);
        if (offsets != small) {
            PyMem_Free(offsets);
        }
        TRY(result);
    }
    TRY(string(b, FIELD(lp, logprob, L_TOKEN), &token));
    start_object(b, 3);
    TRY(offset_slot(b, 0, token));
    TRY(float_slot(b, 1, logprob));
    TRY(offset_slot(b, 2, top_vector));
    return end_object(b, out);
}

static int
chunk_logprobs(Builder *b, PyObject **lps, Py_ssize_t count, Py_ssize_t *offsets,
               Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        TRY(logprob_table(b, lps[i], &offsets[i]));
    }
    return offset_vector(b, offsets, count, out);
}

static void
fill_u32(uint8_t *at, const void *source, Py_ssize_t count)
{
    PyObject *const *ids = source;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* checked before the first pass: exact ints in range */
        int64_t small;
        uint32_t v = small_int(ids[i], &small) ? (uint32_t)small
                                               : (uint32_t)PyLong_AsUnsignedLong(ids[i]);
        memcpy(at + 4 * i, &v, 4);
    }
}

static int
chunk_table(Builder *b, PyObject *c, Py_ssize_t *out)
{
    int64_t created, index64;
    uint64_t seq;
    TRY(int_in(FIELD(c, chunk, C_CREATED), INT64_MIN, INT64_MAX, &created));
    TRY(int_in(FIELD(c, chunk, C_INDEX), 0, UINT32_MAX, &index64));
    TRY(uint64_of(FIELD(c, chunk, C_SEQ), &seq));
    uint32_t index = (uint32_t)index64;

    Py_ssize_t logprobs = 0;
    PyObject *lp_seq = FIELD(c, chunk, C_LOGPROBS);
    if (lp_seq != Py_None) { /* present even when empty: "requested, none in this step" */
        PyObject **lps;
        Py_ssize_t count;
        TRY(items_of(lp_seq, &lps, &count));
        Py_ssize_t small[SMALL], *offsets;
        TRY(offsets_room(count, small, &offsets));
        int result = chunk_logprobs(b, lps, count, offsets, &logprobs);
        if (offsets != small) {
            PyMem_Free(offsets);
        }
        TRY(result);
    }
    PyObject **ids;
    Py_ssize_t nids, token_ids = 0;
    TRY(items_of(FIELD(c, chunk, C_TOKEN_IDS), &ids, &nids));
    for (Py_ssize_t i = 0; i < nids; i++) {
        int64_t id;
        TRY(int_in(ids[i], 0, UINT32_MAX, &id));
    }
    if (nids) {
        TRY(raw_vector(b, 4, nids, 4, fill_u32, ids, &token_ids));
    }
    Py_ssize_t finish = 0, id, model, text_, usage;
    PyObject *finish_reason = FIELD(c, chunk, C_FINISH);
    if (finish_reason != Py_None) {
        TRY(string(b, finish_reason, &finish));
    }
    TRY(text(b, FIELD(c, chunk, C_ID), &id));
    TRY(text(b, FIELD(c, chunk, C_MODEL), &model));
    TRY(text(b, FIELD(c, chunk, C_TEXT), &text_));
    TRY(usage_table(b, FIELD(c, chunk, C_USAGE), &usage));
    start_object(b, 10);
    TRY(offset_slot(b, 0, id));
    TRY(offset_slot(b, 1, model));
    TRY(scalar_slot(b, 2, &created, 8, created == 0));
    TRY(scalar_slot(b, 3, &index, 4, index == 0));
    TRY(scalar_slot(b, 4, &seq, 8, seq == 0));
    TRY(offset_slot(b, 5, token_ids));
    TRY(offset_slot(b, 6, text_));
    TRY(offset_slot(b, 7, logprobs));
    TRY(offset_slot(b, 8, finish));
    TRY(offset_slot(b, 9, usage));
    return end_object(b, out);
}

/* The raw bytes of a C-contiguous, exactly-ndarray array of one of KServe's numeric dtypes. */
typedef struct {
    char kind;          /* 'b' bool, 'i' signed, 'u' unsigned, 'f' float */
    Py_ssize_t itemsize;
} Dtype;

static int
array_buffer(PyObject *array, Py_buffer *view)
{
    if (array == NULL || S.ndarray == NULL || !Py_IS_TYPE(array, S.ndarray)) {
        return STEP_BAIL;
    }
    if (PyObject_GetBuffer(array, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        if (PyErr_ExceptionMatches(PyExc_MemoryError)) {
            return STEP_ERROR;
        }
        PyErr_Clear(); /* not contiguous, or not exportable (object, datetime): the reference's */
        return STEP_BAIL;
    }
    return STEP_OK;
}

/* Whether the buffer's items are `want` in native (= little-endian) order. */
static int
has_dtype(const Py_buffer *view, Dtype want)
{
    const char *format = view->format ? view->format : "B";
    if (*format == '@' || *format == '=' || *format == '<') {
        format++;
    }
    if (format[0] == '\0' || format[1] != '\0' || view->itemsize != want.itemsize) {
        return 0;
    }
    switch (want.kind) {
    case 'b':
        return format[0] == '?';
    case 'i':
        return strchr("bhilq", format[0]) != NULL;
    case 'u':
        return strchr("BHILQ", format[0]) != NULL;
    default:
        return strchr("efd", format[0]) != NULL;
    }
}

/* KServe's numeric datatypes (codecs/model.py DATATYPES); BYTES is handed back. */
static int
datatype_dtype(PyObject *datatype, Dtype *out)
{
    static const struct {
        const char *name;
        Dtype dtype;
    } TABLE[] = {
        {"BOOL", {'b', 1}},  {"UINT8", {'u', 1}}, {"UINT16", {'u', 2}}, {"UINT32", {'u', 4}},
        {"UINT64", {'u', 8}}, {"INT8", {'i', 1}},  {"INT16", {'i', 2}},  {"INT32", {'i', 4}},
        {"INT64", {'i', 8}},  {"FP16", {'f', 2}},  {"FP32", {'f', 4}},   {"FP64", {'f', 8}},
    };
    if (datatype == NULL || !PyUnicode_CheckExact(datatype) || !PyUnicode_IS_ASCII(datatype)) {
        return STEP_BAIL;
    }
    const char *name = (const char *)PyUnicode_DATA(datatype);
    size_t length = (size_t)PyUnicode_GET_LENGTH(datatype);
    for (size_t i = 0; i < sizeof(TABLE) / sizeof(TABLE[0]); i++) {
        /* by length too: a str may hold a NUL */
        if (strlen(TABLE[i].name) == length && memcmp(name, TABLE[i].name, length) == 0) {
            *out = TABLE[i].dtype;
            return STEP_OK;
        }
    }
    return STEP_BAIL;
}

static void
fill_i64(uint8_t *at, const void *source, Py_ssize_t count)
{
    const Py_ssize_t *shape = source;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t v = (int64_t)shape[i];
        memcpy(at + 8 * i, &v, 8);
    }
}

static int
tensor_with(Builder *b, PyObject *t, const Py_buffer *view, Py_ssize_t *out)
{
    Dtype dtype;
    TRY(datatype_dtype(FIELD(t, tensor, X_DATATYPE), &dtype));
    if (!has_dtype(view, dtype)) {
        return STEP_BAIL;
    }
    /* the shape: an exact tuple of exact ints, equal to the array's */
    PyObject *shape = FIELD(t, tensor, X_SHAPE);
    if (shape == NULL || !PyTuple_CheckExact(shape) || PyTuple_GET_SIZE(shape) != view->ndim) {
        return STEP_BAIL;
    }
    for (Py_ssize_t i = 0; i < view->ndim; i++) {
        int64_t dim;
        TRY(int_in(PyTuple_GET_ITEM(shape, i), 0, INT64_MAX, &dim));
        if (dim != (int64_t)view->shape[i]) {
            return STEP_BAIL;
        }
    }
    Py_ssize_t data = 0, shape_vector = 0, name, datatype;
    if (view->len) {
        TRY(raw_vector(b, 1, view->len, DATA_ALIGNMENT, NULL, view->buf, &data));
    }
    if (view->ndim) {
        TRY(raw_vector(b, 8, view->ndim, 8, fill_i64, view->shape, &shape_vector));
    }
    TRY(text(b, FIELD(t, tensor, X_NAME), &name));
    TRY(string(b, FIELD(t, tensor, X_DATATYPE), &datatype));
    start_object(b, 4);
    TRY(offset_slot(b, 0, name));
    TRY(offset_slot(b, 1, datatype));
    TRY(offset_slot(b, 2, shape_vector));
    TRY(offset_slot(b, 3, data));
    return end_object(b, out);
}

static int
tensor_table(Builder *b, PyObject *t, Py_ssize_t *out)
{
    if (!Py_IS_TYPE(t, S.tensor.type)) {
        return STEP_BAIL;
    }
    Py_buffer view;
    TRY(array_buffer(FIELD(t, tensor, X_DATA), &view));
    int result = tensor_with(b, t, &view, out);
    PyBuffer_Release(&view);
    return result;
}

static int
infer_tensors(Builder *b, PyObject **tensors, Py_ssize_t count, Py_ssize_t *offsets,
              Py_ssize_t *out)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        TRY(tensor_table(b, tensors[i], &offsets[i]));
    }
    return offset_vector(b, offsets, count, out);
}

/* InferRequest and InferResponse: the same layout, inputs or outputs in slot 2. */
static int
infer_table(Builder *b, PyObject *m, const ModelClass *cls, Py_ssize_t *out)
{
#define INFER_FIELD(field) (*(PyObject **)((char *)m + cls->offsets[field]))
    PyObject **tensors;
    Py_ssize_t count, vector = 0, model, id;
    TRY(items_of(INFER_FIELD(R_TENSORS), &tensors, &count));
    if (count) {
        Py_ssize_t small[SMALL], *offsets;
        TRY(offsets_room(count, small, &offsets));
        int result = infer_tensors(b, tensors, count, offsets, &vector);
        if (offsets != small) {
            PyMem_Free(offsets);
        }
        TRY(result);
    }
    TRY(text(b, INFER_FIELD(R_MODEL), &model));
    TRY(text(b, INFER_FIELD(R_ID), &id));
#undef INFER_FIELD
    start_object(b, 3);
    TRY(offset_slot(b, 0, model));
    TRY(offset_slot(b, 1, id));
    TRY(offset_slot(b, 2, vector));
    return end_object(b, out);
}

static int
embedding_with(Builder *b, PyObject *e, const Py_buffer *view, Py_ssize_t *out)
{
    const Dtype float32 = {'f', 4};
    if (view->ndim != 2 || !has_dtype(view, float32)) {
        return STEP_BAIL;
    }
    if ((uint64_t)view->shape[0] > UINT32_MAX || (uint64_t)view->shape[1] > UINT32_MAX) {
        return STEP_BAIL;
    }
    uint32_t batch = (uint32_t)view->shape[0], dim = (uint32_t)view->shape[1];
    Py_ssize_t data = 0, model, usage;
    if (view->len) {
        TRY(raw_vector(b, 4, view->len / 4, DATA_ALIGNMENT, NULL, view->buf, &data));
    }
    TRY(text(b, FIELD(e, embedding, E_MODEL), &model));
    TRY(usage_table(b, FIELD(e, embedding, E_USAGE), &usage));
    start_object(b, 5);
    TRY(offset_slot(b, 0, model));
    TRY(scalar_slot(b, 1, &batch, 4, batch == 0));
    TRY(scalar_slot(b, 2, &dim, 4, dim == 0));
    TRY(offset_slot(b, 3, data));
    TRY(offset_slot(b, 4, usage));
    return end_object(b, out);
}

static int
embedding_table(Builder *b, PyObject *e, Py_ssize_t *out)
{
    Py_buffer view;
    TRY(array_buffer(FIELD(e, embedding, E_VECTORS), &view));
    int result = embedding_with(b, e, &view, out);
    PyBuffer_Release(&view);
    return result;
}

/* The whole buffer: the payload, the Envelope, FinishSizePrefixed(root, b"IWF1"). */
static int
build(Builder *b, PyObject *message)
{
    Py_ssize_t payload;
    uint8_t payload_type;
    PyTypeObject *type = Py_TYPE(message);
    if (type == S.chunk.type) {
        payload_type = PAYLOAD_TOKEN_CHUNK;
        TRY(chunk_table(b, message, &payload));
    }
    else if (type == S.embedding.type) {
        payload_type = PAYLOAD_EMBEDDING_BATCH;
        TRY(embedding_table(b, message, &payload));
    }
    else if (type == S.request.type) {
        payload_type = PAYLOAD_INFER_REQUEST;
        TRY(infer_table(b, message, &S.request, &payload));
    }
    else if (type == S.response.type) {
        payload_type = PAYLOAD_INFER_RESPONSE;
        TRY(infer_table(b, message, &S.response, &payload));
    }
    else {
        return STEP_BAIL;
    }
    Py_ssize_t root;
    start_object(b, 2);
    TRY(scalar_slot(b, 0, &payload_type, 1, 0));
    TRY(offset_slot(b, 1, payload));
    TRY(end_object(b, &root));
    /* Builder.__Finish with a size prefix and a file identifier */
    TRY(prep(b, b->minalign, 12));
    TRY(prep(b, 4, 4));
    static const char IDENTIFIER[4] = {'I', 'W', 'F', '1'};
    TRY(place(b, IDENTIFIER, 4)); /* its bytes one at a time from the last, as one block */
    TRY(prepend_uoffset(b, root));
    uint32_t size = (uint32_t)b->off;
    return prepend(b, &size, 4);
}

/* ---- the module ------------------------------------------------------------------------------- */

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, EmbeddingBatch, "
                        "Tensor, InferRequest, InferResponse, numpy.ndarray)");
        return NULL;
    }
    S.configured = 0;
    if (bind_chunk_classes(&S.chunk, &S.logprob, &S.top, &S.usage, args, 0) < 0 ||
        bind_class(&S.embedding, args[4], EMBEDDING_FIELDS, E_FIELDS) < 0 ||
        bind_class(&S.tensor, args[5], TENSOR_FIELDS, X_FIELDS) < 0 ||
        bind_class(&S.request, args[6], REQUEST_FIELDS, R_FIELDS) < 0 ||
        bind_class(&S.response, args[7], RESPONSE_FIELDS, R_FIELDS) < 0) {
        return NULL;
    }
    if (!PyType_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "configure() takes numpy.ndarray last");
        return NULL;
    }
    Py_INCREF(args[8]);
    Py_XSETREF(S.ndarray, (PyTypeObject *)args[8]);
    S.configured = 1;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(encode_doc,
             "encode(message, /)\n--\n\n"
             "The size-prefixed FlatBuffer of a TokenChunk, EmbeddingBatch, InferRequest or\n"
             "InferResponse, the bytes flatbuffers_codec.encode_reference writes; None for\n"
             "anything this encoder does not take (the reference then encodes it or raises).");

static PyObject *
encode(PyObject *module, PyObject *message)
{
    if (!S.configured) {
        PyErr_SetString(PyExc_TypeError, "_flatbuffers_accel.configure() was not called");
        return NULL;
    }
#if !PY_LITTLE_ENDIAN
    Py_RETURN_NONE; /* every value is written as the host holds it: little-endian only */
#endif
    /* A message that fits the stack buffer is built once and copied out (a token chunk: a few
     * hundred bytes); a larger one is measured, then written into a bytes object of its size. */
    uint8_t scratch[SCRATCH_BYTES];
    Builder b;
    builder_init(&b, scratch, SCRATCH_BYTES);
    int result = build(&b, message);
    int overran = b.overrun;
    builder_free(&b);
    if (result == STEP_ERROR) {
        return NULL;
    }
    if (!overran) {
        if (result == STEP_BAIL) {
            Py_RETURN_NONE;
        }
        return PyBytes_FromStringAndSize((const char *)scratch + (SCRATCH_BYTES - b.off), b.off);
    }
    builder_init(&b, NULL, 0);
    result = build(&b, message);
    Py_ssize_t size = b.off;
    builder_free(&b);
    if (result == STEP_ERROR) {
        return NULL;
    }
    if (result == STEP_BAIL) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) {
        return NULL;
    }
    builder_init(&b, (uint8_t *)PyBytes_AS_STRING(out), size);
    result = build(&b, message);
    int complete = b.off == size && !b.overrun;
    builder_free(&b);
    if (result == STEP_ERROR) {
        Py_DECREF(out);
        return NULL;
    }
    if (result == STEP_BAIL || !complete) { /* the two passes disagree: a bug, not the input */
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"configure", FASTCALL(configure), METH_FASTCALL,
     "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, EmbeddingBatch, Tensor, "
     "InferRequest, InferResponse, ndarray, /)\n--\n\n"
     "Bind the model classes and numpy's array type; call once before encode()."},
    {"encode", encode, METH_O, encode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.codecs._flatbuffers_accel",
    .m_doc = "The FlatBuffers codec's encoder, compiled (see codecs/flatbuffers_codec.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__flatbuffers_accel(void)
{
    return module_with_version(&module_def, API_VERSION);
}
