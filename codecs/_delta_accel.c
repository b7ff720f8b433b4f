/* _delta_accel: the delta codec's per-frame work, compiled.
 *
 * codecs/delta_wire.py gives the bytes; the pure Python encoder and decoder (delta_encoder.py,
 * delta_decoder.py) are the reference and stay the fallback. This module does the hot work of
 * one stream's steady state and nothing else:
 *
 *   encode_frame  one chunk -> the bytes of its frame (length prefix included), updating the
 *                 encoder's string table, byte for byte what DeltaStreamEncoder._encode writes;
 *   decode_frames the complete frames at the front of a buffer -> chunks, as long as each is in
 *                 sequence and has the shape the encoder writes.
 *
 * Anything else (a type or value the encoder refuses, a frame out of turn, an unknown or
 * repeated field, a bad ref, invalid UTF-8, a partial frame, the end marker) is handed back
 * untouched: encode_frame returns None before changing the table, decode_frames returns the
 * position of the frame it did not take. The Python path then does what it always does, and
 * raises its own typed errors. The only exception raised here is MemoryError (and TypeError
 * for arguments of the wrong type, which the codec never passes).
 *
 * Hostile bytes: every read is bounds-checked against the frame or field it belongs to, varints
 * stop at 10 bytes and 64 bits, lengths are checked before use, and nothing is allocated from a
 * declared size: a tuple of token ids is sized by the ids actually present.
 *
 * Hostile objects: a lookup in the encoder's string table can run Python code (the __eq__ of a
 * str subclass the Python path interned), which can rebind a frozen chunk's slots. So the chunk
 * is read once, before the first lookup, into strong references (Frame), and never again.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_extension.h"
#include "_model_slots.h"
#include "_wire_buf.h"

/* Bumped when an argument list changes: delta_codec ignores a stale build that disagrees.
 * 2: encode_frame and decode_frames take the wire format's float32 flag. */
#define API_VERSION 2

#define MAX_SCALE 22
#define MAX_EXACT ((int64_t)1 << 53)
#define UINT32_LIMIT ((uint64_t)1 << 32)

/* 10.0 ** k for k <= 22: every one an exact double (delta_wire._POW10). */
static const double POW10[MAX_SCALE + 1] = {
    1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
    1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
};

/* ---- the model classes, written through their slots --------------------------------------- */


static struct {
    int configured;
    ModelClass chunk, logprob, top, usage;
    Py_ssize_t max_entries; /* MAX_TABLE_ENTRIES */
    Py_ssize_t max_chars;   /* MAX_INTERNED_CHARS */
    PyObject *empty;        /* "" */
} S;

#define SLOT(obj, cls, field) (*(PyObject **)((char *)(obj) + S.cls.offsets[field]))

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, max_entries, "
                        "max_chars)");
        return NULL;
    }
    S.configured = 0;
    if (bind_chunk_classes(&S.chunk, &S.logprob, &S.top, &S.usage, args, 1) < 0) {
        return NULL;
    }
    Py_ssize_t max_entries = PyLong_AsSsize_t(args[4]);
    Py_ssize_t max_chars = PyLong_AsSsize_t(args[5]);
    if ((max_entries == -1 || max_chars == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (max_entries < 0 || max_chars < 0) {
        PyErr_SetString(PyExc_ValueError, "table limits must not be negative");
        return NULL;
    }
    S.max_entries = max_entries;
    S.max_chars = max_chars;
    if (S.empty == NULL && (S.empty = PyUnicode_FromStringAndSize("", 0)) == NULL) {
        return NULL;
    }
    S.configured = 1;
    Py_RETURN_NONE;
}

/* ---- varints -------------------------------------------------------------------------------- */

/* A length-delimited field's payload at *pos: [*start, *stop) inside end. */
static inline int
read_len(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *start,
         Py_ssize_t *stop)
{
    uint64_t length;
    if (!read_varint(data, pos, end, &length) || length > (uint64_t)(end - *pos)) {
        return 0;
    }
    *start = *pos;
    *stop = *pos + (Py_ssize_t)length;
    *pos = *stop;
    return 1;
}

static inline int64_t
unzigzag(uint64_t value)
{
    return (int64_t)(value >> 1) ^ -(int64_t)(value & 1);
}

static inline uint64_t
zigzag(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63);
}

/* ---- the output buffer ---------------------------------------------------------------------- */

static inline int
put_bytes(Buf *buf, const char *bytes, Py_ssize_t size)
{
    if (buf_reserve(buf, size) < 0) {
        return -1;
    }
    memcpy(buf->data + buf->len, bytes, size);
    buf->len += size;
    return 0;
}

static inline int
put_double(Buf *buf, double value)
{
    if (buf_reserve(buf, 8) < 0) {
        return -1;
    }
    if (PyFloat_Pack8(value, buf->data + buf->len, 1) < 0) {
        return -1;
    }
    buf->len += 8;
    return 0;
}

static inline int
put_float32(Buf *buf, double value)
{
    if (buf_reserve(buf, 4) < 0) {
        return -1;
    }
    if (PyFloat_Pack4(value, buf->data + buf->len, 1) < 0) {
        return -1;
    }
    buf->len += 4;
    return 0;
}

/* delta_wire.to_float32: whether a float32 holds value exactly (NaN never: its payload is kept
 * only as a double). The cast is the one PyFloat_Pack4 (the struct module's "<f") makes; a value
 * past the largest float32 is refused before it, as Pack4 refuses one that rounds to infinity
 * (one that rounds down to FLT_MAX is another value, so not exact either way). */
static inline int
float32_exact(double value)
{
    if (isnan(value)) {
        return 0;
    }
    if (isinf(value)) {
        return 1;
    }
    if (fabs(value) > FLT_MAX) {
        return 0;
    }
    return (double)(float)value == value;
}

/* ---- logprobs as decimals ------------------------------------------------------------------- */

/* delta_wire.to_decimal: value == mantissa / 10**scale exactly, from the shortest repr.
 * 1: found; 0: none (nan, inf, zero, exponent notation, too many places or digits); -1: error. */
static int
decimal(double value, int64_t *mantissa, int *scale)
{
    char *text = PyOS_double_to_string(value, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (text == NULL) {
        return -1;
    }
    int found = 0;
    const char *dot = strchr(text, '.');
    if (dot != NULL && strchr(dot, 'e') == NULL) {
        const char *fraction = dot + 1;
        size_t places = strlen(fraction);
        if (places == 1 && fraction[0] == '0') {
            places = 0; /* "123.0": an integer */
        }
        if (places <= MAX_SCALE) {
            const char *at = text;
            int negative = *at == '-';
            at += negative;
            uint64_t digits = 0;
            int fits = 1;
            for (; at < dot + 1 + places && fits; at++) {
                if (at == dot) {
                    continue;
                }
                if (*at < '0' || *at > '9') {
                    fits = 0;
                    break;
                }
                digits = digits * 10 + (uint64_t)(*at - '0');
                fits = digits < (uint64_t)MAX_EXACT;
            }
            if (fits && digits != 0) { /* zero keeps its sign only as a double */
                *mantissa = negative ? -(int64_t)digits : (int64_t)digits;
                *scale = (int)places;
                found = 1;
            }
        }
    }
    PyMem_Free(text);
    return found;
}

/* ---- encoding ------------------------------------------------------------------------------- */

/* A string of a Logprob (its token, or an alternative's) and the logprob that goes with it. */
typedef struct {
    PyObject *token;         /* a strong reference to an exact str */
    double value;
    Py_ssize_t alternatives; /* in a Logprob's own entry: how many entries (its top) follow */
} Entry;

#define SMALL_ENTRIES 64

/* What a chunk's frame is written from, read out of the chunk before the first string-table
 * lookup and held by strong references. A lookup can run Python code: the table's dict may hold
 * a str subclass (the Python path interns whatever the caller passed) whose __eq__ is called on
 * a hash match, and that code can rebind the slots of the chunk, its Logprobs and their
 * alternatives (object.__setattr__ gets past frozen). Nothing is read from those objects after
 * it could run, so no borrowed pointer can dangle and no checked type can change under us. */
typedef struct {
    PyObject *token_ids; /* an exact tuple of exact ints below 2**32 (immutable, all of it) */
    PyObject *text;      /* an exact str */
    PyObject *finish;    /* an exact str, or NULL for None */
    int has_logprobs;
    int has_usage;
    uint64_t prompt, completion;
    Py_ssize_t logprobs; /* how many Logprobs the entries hold */
    Entry *entries;      /* each Logprob's entry, then its alternatives' */
    Py_ssize_t count;    /* entries filled (and holding a reference) */
    Entry small[SMALL_ENTRIES];
} Frame;

static void
frame_init(Frame *frame)
{
    frame->token_ids = frame->text = frame->finish = NULL;
    frame->has_logprobs = frame->has_usage = 0;
    frame->prompt = frame->completion = 0;
    frame->logprobs = 0;
    frame->entries = frame->small;
    frame->count = 0;
}

static void
frame_clear(Frame *frame)
{
    for (Py_ssize_t i = 0; i < frame->count; i++) {
        Py_DECREF(frame->entries[i].token);
    }
    if (frame->entries != frame->small) {
        PyMem_Free(frame->entries);
    }
    Py_CLEAR(frame->token_ids);
    Py_CLEAR(frame->text);
    Py_CLEAR(frame->finish);
    frame->entries = frame->small;
    frame->count = 0;
}

/* An exact int in [0, 2**32). */
static int
uint32_value(PyObject *value, uint64_t *out)
{
    if (!PyLong_CheckExact(value)) {
        return 0;
    }
    int overflow;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || number < 0 || (uint64_t)number >= UINT32_LIMIT) {
        return 0;
    }
    *out = (uint64_t)number;
    return 1;
}

/* Every check the Python path makes that does not need the string table, and the exact types
 * this path takes; then the values into frame. STEP_BAIL hands the chunk to the Python path
 * unchanged. No Python code runs in here: the comparisons are of exact str and int. */
static int
read_chunk(Frame *frame, PyObject *chunk, PyObject *base, PyObject *next_seq, int carries_usage)
{
    for (int field = C_ID; field <= C_USAGE; field++) {
        if (*(PyObject **)((char *)chunk + S.chunk.offsets[field]) == NULL) {
            return STEP_BAIL; /* an unset slot: the Python path raises AttributeError */
        }
    }
    /* the same response: id and model equal strings, created and index equal ints */
    for (int field = C_ID; field <= C_INDEX; field++) {
        PyObject *value = *(PyObject **)((char *)chunk + S.chunk.offsets[field]);
        PyObject *expected = PyTuple_GET_ITEM(base, field);
        int exact = field <= C_MODEL
                        ? PyUnicode_CheckExact(value) && PyUnicode_CheckExact(expected)
                        : PyLong_CheckExact(value) && PyLong_CheckExact(expected);
        if (!exact) {
            return STEP_BAIL; /* the Python path compares other types with their own __ne__ */
        }
        int equal = PyObject_RichCompareBool(value, expected, Py_EQ); /* identity first */
        if (equal <= 0) {
            return equal < 0 ? STEP_ERROR : STEP_BAIL;
        }
    }
    PyObject *seq = SLOT(chunk, chunk, C_SEQ);
    if (!PyLong_CheckExact(seq) || !PyLong_CheckExact(next_seq)) {
        return STEP_BAIL;
    }
    int equal = PyObject_RichCompareBool(seq, next_seq, Py_EQ);
    if (equal <= 0) {
        return equal < 0 ? STEP_ERROR : STEP_BAIL;
    }
    PyObject *token_ids = SLOT(chunk, chunk, C_TOKEN_IDS);
    if (!PyTuple_CheckExact(token_ids)) {
        return STEP_BAIL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(token_ids); i++) {
        uint64_t token_id;
        if (!uint32_value(PyTuple_GET_ITEM(token_ids, i), &token_id)) {
            return STEP_BAIL;
        }
    }
    PyObject *text = SLOT(chunk, chunk, C_TEXT);
    if (!PyUnicode_CheckExact(text)) {
        return STEP_BAIL;
    }
    /* the Logprobs: checked and counted, then (nothing having run in between) copied */
    PyObject *logprobs = SLOT(chunk, chunk, C_LOGPROBS);
    Py_ssize_t entries = 0;
    if (logprobs != Py_None) {
        if (!PyTuple_CheckExact(logprobs)) {
            return STEP_BAIL;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(logprobs); i++) {
            PyObject *lp = PyTuple_GET_ITEM(logprobs, i);
            if (!Py_IS_TYPE(lp, S.logprob.type)) {
                return STEP_BAIL;
            }
            PyObject *token = SLOT(lp, logprob, L_TOKEN);
            PyObject *value = SLOT(lp, logprob, L_LOGPROB);
            PyObject *top = SLOT(lp, logprob, L_TOP);
            if (token == NULL || value == NULL || top == NULL || !PyUnicode_CheckExact(token) ||
                !PyFloat_CheckExact(value) || !PyTuple_CheckExact(top)) {
                return STEP_BAIL;
            }
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(top); j++) {
                PyObject *alternative = PyTuple_GET_ITEM(top, j);
                if (!Py_IS_TYPE(alternative, S.top.type)) {
                    return STEP_BAIL;
                }
                PyObject *alt_token = SLOT(alternative, top, T_TOKEN);
                PyObject *alt_value = SLOT(alternative, top, T_LOGPROB);
                if (alt_token == NULL || alt_value == NULL || !PyUnicode_CheckExact(alt_token) ||
                    !PyFloat_CheckExact(alt_value)) {
                    return STEP_BAIL;
                }
            }
            entries += 1 + PyTuple_GET_SIZE(top);
        }
    }
    PyObject *finish = SLOT(chunk, chunk, C_FINISH);
    if (finish != Py_None && !PyUnicode_CheckExact(finish)) {
        return STEP_BAIL;
    }
    PyObject *usage = SLOT(chunk, chunk, C_USAGE);
    if (usage != Py_None) {
        if (!carries_usage || !Py_IS_TYPE(usage, S.usage.type)) {
            return STEP_BAIL;
        }
        PyObject *prompt = SLOT(usage, usage, U_PROMPT);
        PyObject *completion = SLOT(usage, usage, U_COMPLETION);
        if (prompt == NULL || completion == NULL || !uint32_value(prompt, &frame->prompt) ||
            !uint32_value(completion, &frame->completion)) {
            return STEP_BAIL;
        }
        frame->has_usage = 1;
    }
    if (entries > SMALL_ENTRIES && (frame->entries = PyMem_New(Entry, entries)) == NULL) {
        frame->entries = frame->small;
        PyErr_NoMemory();
        return STEP_ERROR;
    }
    if (logprobs != Py_None) {
        frame->has_logprobs = 1;
        frame->logprobs = PyTuple_GET_SIZE(logprobs);
        for (Py_ssize_t i = 0; i < frame->logprobs; i++) {
            PyObject *lp = PyTuple_GET_ITEM(logprobs, i);
            PyObject *top = SLOT(lp, logprob, L_TOP);
            Entry *entry = &frame->entries[frame->count++];
            entry->token = Py_NewRef(SLOT(lp, logprob, L_TOKEN));
            entry->value = PyFloat_AS_DOUBLE(SLOT(lp, logprob, L_LOGPROB));
            entry->alternatives = PyTuple_GET_SIZE(top);
            for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(top); j++) {
                PyObject *alternative = PyTuple_GET_ITEM(top, j);
                Entry *alt = &frame->entries[frame->count++];
                alt->token = Py_NewRef(SLOT(alternative, top, T_TOKEN));
                alt->value = PyFloat_AS_DOUBLE(SLOT(alternative, top, T_LOGPROB));
                alt->alternatives = 0;
            }
        }
    }
    frame->token_ids = Py_NewRef(token_ids);
    frame->text = Py_NewRef(text);
    frame->finish = finish == Py_None ? NULL : Py_NewRef(finish);
    return STEP_OK;
}

/* Whether text (an exact str) is a string the encoder can write: in the table already or
 * encodable to UTF-8 (a lone surrogate is not: the Python path raises for it). */
static int
writable_str(PyObject *text, PyObject *index)
{
    if (PyDict_GetItemWithError(index, text) != NULL) {
        return STEP_OK;
    }
    if (PyErr_Occurred()) {
        return STEP_ERROR;
    }
    Py_ssize_t size;
    if (PyUnicode_AsUTF8AndSize(text, &size) == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_Clear();
            return STEP_BAIL;
        }
        return STEP_ERROR;
    }
    return STEP_OK;
}

/* The last checks, before anything is written or added to the table: every string encodes. */
static int
check_strings(const Frame *frame, PyObject *index)
{
    int step = writable_str(frame->text, index);
    for (Py_ssize_t i = 0; i < frame->count && step == STEP_OK; i++) {
        step = writable_str(frame->entries[i].token, index);
    }
    if (step == STEP_OK && frame->finish != NULL) {
        step = writable_str(frame->finish, index);
    }
    return step;
}

static int
same_str(PyObject *a, PyObject *b)
{
    return a == b || PyUnicode_Compare(a, b) == 0; /* both exact str: no error */
}

/* StringTable.ref: the table ref of text (0: it is sent literally, and joins the table if it
 * may). */
static int
table_ref(PyObject *index, PyObject *strings, PyObject *text, uint64_t *ref)
{
    PyObject *found = PyDict_GetItemWithError(index, text);
    if (found != NULL) {
        Py_ssize_t position = PyLong_AsSsize_t(found);
        if (position < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_ValueError, "corrupt string table");
            }
            return -1;
        }
        *ref = (uint64_t)position + 1;
        return 0;
    }
    if (PyErr_Occurred()) {
        return -1;
    }
    *ref = 0;
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    Py_ssize_t entries = PyList_GET_SIZE(strings);
    if (0 < length && length <= S.max_chars && entries < S.max_entries) {
        PyObject *position = PyLong_FromSsize_t(entries);
        if (position == NULL) {
            return -1;
        }
        int failed = PyDict_SetItem(index, text, position);
        Py_DECREF(position);
        if (failed || PyList_Append(strings, text) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A string field of the frame or a Logprob: its table ref under ref_key, else its UTF-8 under
 * literal_key (nothing for an empty string, which is never in the table). */
static int
put_string(Buf *buf, PyObject *index, PyObject *strings, PyObject *text, uint8_t ref_key,
           uint8_t literal_key)
{
    uint64_t ref;
    if (table_ref(index, strings, text, &ref) < 0) {
        return -1;
    }
    if (ref) {
        return put_byte(buf, ref_key) < 0 || put_varint(buf, ref) < 0 ? -1 : 0;
    }
    Py_ssize_t size;
    const char *raw = PyUnicode_AsUTF8AndSize(text, &size);
    if (raw == NULL) {
        return -1;
    }
    if (size == 0) {
        return 0;
    }
    if (put_byte(buf, literal_key) < 0 || put_varint(buf, (uint64_t)size) < 0 ||
        put_bytes(buf, raw, size) < 0) {
        return -1;
    }
    return 0;
}

/* key, then text's UTF-8, however short. */
static int
put_literal(Buf *buf, uint8_t key, PyObject *text)
{
    Py_ssize_t size;
    const char *raw = PyUnicode_AsUTF8AndSize(text, &size);
    if (raw == NULL || put_byte(buf, key) < 0 || put_varint(buf, (uint64_t)size) < 0 ||
        put_bytes(buf, raw, size) < 0) {
        return -1;
    }
    return 0;
}

#define SMALL_TOP 32

/* delta_encoder._top_logprobs for the count alternatives at top: decimals over one common scale,
 * else doubles; with float32 (wire format 1) the shortest of those and float32s, a tie to the
 * first. */
static int
put_top_values(Buf *buf, const Entry *top, Py_ssize_t count, int float32)
{
    int64_t small[SMALL_TOP];
    int64_t *mantissas = small;
    int *scales = NULL;
    int small_scales[SMALL_TOP];
    int result = -1;
    if (count > SMALL_TOP) {
        mantissas = PyMem_New(int64_t, count);
        scales = PyMem_New(int, count);
        if (mantissas == NULL || scales == NULL) {
            PyErr_NoMemory();
            goto done;
        }
    }
    else {
        scales = small_scales;
    }
    int scale = 0;
    int exact = 1;
    for (Py_ssize_t i = 0; i < count && exact; i++) {
        int found = decimal(top[i].value, &mantissas[i], &scales[i]);
        if (found < 0) {
            goto done;
        }
        exact = found;
        if (exact && scales[i] > scale) {
            scale = scales[i];
        }
    }
    /* each mantissa at the common scale, while all stay below 2**53 (no step overflows) */
    for (Py_ssize_t i = 0; i < count && exact; i++) {
        for (int k = scales[i]; k < scale && exact; k++) {
            mantissas[i] *= 10;
            exact = mantissas[i] < MAX_EXACT && mantissas[i] > -MAX_EXACT;
        }
    }
    enum { DECIMALS, FLOAT32S, DOUBLES } form = exact ? DECIMALS : DOUBLES;
    if (float32) {
        Py_ssize_t best = 0; /* the chosen form's size; 0 for none yet */
        if (exact) {
            Py_ssize_t payload = 0;
            for (Py_ssize_t i = 0; i < count; i++) {
                payload += varint_size(zigzag(mantissas[i]));
            }
            best = 1 + varint_size((uint64_t)payload) + payload + 2;
        }
        int singles = 1;
        for (Py_ssize_t i = 0; i < count && singles; i++) {
            singles = float32_exact(top[i].value);
        }
        Py_ssize_t size = 1 + varint_size((uint64_t)count * 4) + count * 4;
        if (singles && (!best || size < best)) {
            form = FLOAT32S;
            best = size;
        }
        if (best && 1 + varint_size((uint64_t)count * 8) + count * 8 < best) {
            form = DOUBLES;
        }
    }
    if (form == DECIMALS) {
        Py_ssize_t mark;
        if (begin_len(buf, 0x52, &mark) < 0) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            if (put_varint(buf, zigzag(mantissas[i])) < 0) {
                goto done;
            }
        }
        if (end_len(buf, mark) < 0 || put_byte(buf, 0x58) < 0 ||
            put_byte(buf, (uint8_t)scale) < 0) {
            goto done;
        }
    }
    else if (form == FLOAT32S) {
        if (put_byte(buf, 0x6A) < 0 || put_varint(buf, (uint64_t)count * 4) < 0) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            if (put_float32(buf, top[i].value) < 0) {
                goto done;
            }
        }
    }
    else {
        if (put_byte(buf, 0x3A) < 0 || put_varint(buf, (uint64_t)count * 8) < 0) {
            goto done;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            if (put_double(buf, top[i].value) < 0) {
                goto done;
            }
        }
    }
    result = 0;
done:
    if (mantissas != small) {
        PyMem_Free(mantissas);
    }
    if (scales != small_scales) {
        PyMem_Free(scales);
    }
    return result;
}

/* delta_encoder._value: a logprob's value field, a decimal where one is exact, else a double;
 * with float32 the shortest of decimal, float32 and double, a tie to the first. */
static int
put_value(Buf *buf, double value, int float32)
{
    int64_t mantissa;
    int scale;
    int found = decimal(value, &mantissa, &scale);
    if (found < 0) {
        return -1;
    }
    int size = found ? 3 + varint_size(zigzag(mantissa)) : 9;
    if (float32 && size > 5 && float32_exact(value)) {
        return put_byte(buf, 0x65) < 0 || put_float32(buf, value) < 0 ? -1 : 0;
    }
    if (!found || (float32 && size > 9)) {
        return put_byte(buf, 0x19) < 0 || put_double(buf, value) < 0 ? -1 : 0;
    }
    if (put_byte(buf, 0x40) < 0 || put_varint(buf, zigzag(mantissa)) < 0 ||
        put_byte(buf, 0x48) < 0 || put_byte(buf, (uint8_t)scale) < 0) {
        return -1;
    }
    return 0;
}

static int
same_float(double a, double b)
{
    return a == b && (a != 0.0 || copysign(1.0, a) == copysign(1.0, b));
}

/* delta_encoder._logprob: one Logprob message's fields, from its entry and the alternatives'
 * entries right after it. */
static int
put_logprob(Buf *buf, PyObject *index, PyObject *strings, const Entry *lp, int float32)
{
    PyObject *token = lp->token;
    double value = lp->value;
    const Entry *top = lp + 1;
    Py_ssize_t count = lp->alternatives;
    if (put_string(buf, index, strings, token, 0x08, 0x12) < 0 ||
        put_value(buf, value, float32) < 0) {
        return -1;
    }
    Py_ssize_t first = 0;
    if (count && same_str(top[0].token, token) && same_float(top[0].value, value)) {
        if (put_byte(buf, 0x20) < 0 || put_byte(buf, 0x01) < 0) {
            return -1;
        }
        first = 1;
    }
    if (first == count) {
        return 0;
    }
    /* The refs, in order: each new string joins the table as it comes, so a later alternative
     * may already refer to it. Then the literals, for the refs that are 0. */
    Py_ssize_t mark;
    if (begin_len(buf, 0x2A, &mark) < 0) {
        return -1;
    }
    int literals = 0;
    for (Py_ssize_t i = first; i < count; i++) {
        uint64_t ref;
        if (table_ref(index, strings, top[i].token, &ref) < 0 || put_varint(buf, ref) < 0) {
            return -1;
        }
        literals |= ref == 0;
    }
    Py_ssize_t refs_length = buf->len - mark - 1;
    if (end_len(buf, mark) < 0) {
        return -1;
    }
    if (literals) {
        /* read the refs back from the buffer (which put_literal may move) */
        Py_ssize_t at = mark + varint_size((uint64_t)refs_length);
        Py_ssize_t refs_end = at + refs_length;
        for (Py_ssize_t i = first; at < refs_end; i++) {
            uint64_t ref = 0;
            read_varint((const uint8_t *)buf->data, &at, refs_end, &ref); /* ours */
            if (ref == 0 && put_literal(buf, 0x32, top[i].token) < 0) {
                return -1;
            }
        }
    }
    return put_top_values(buf, top + first, count - first, float32);
}

static int
put_frame(Buf *buf, const Frame *frame, uint64_t offset, PyObject *index, PyObject *strings,
          int float32)
{
    if (offset && (put_byte(buf, 0x08) < 0 || put_varint(buf, offset) < 0)) {
        return -1;
    }
    PyObject *token_ids = frame->token_ids;
    if (float32 && PyTuple_GET_SIZE(token_ids) == 1) {
        uint64_t token_id = 0;
        uint32_value(PyTuple_GET_ITEM(token_ids, 0), &token_id); /* checked */
        if (put_byte(buf, 0x10) < 0 || put_varint(buf, token_id) < 0) {
            return -1;
        }
    }
    else if (PyTuple_GET_SIZE(token_ids)) {
        Py_ssize_t mark;
        if (begin_len(buf, 0x12, &mark) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(token_ids); i++) {
            uint64_t token_id = 0;
            uint32_value(PyTuple_GET_ITEM(token_ids, i), &token_id); /* checked */
            if (put_varint(buf, token_id) < 0) {
                return -1;
            }
        }
        if (end_len(buf, mark) < 0) {
            return -1;
        }
    }
    if (put_string(buf, index, strings, frame->text, 0x18, 0x22) < 0) {
        return -1;
    }
    if (frame->has_logprobs) {
        if ((!float32 || frame->logprobs == 0) &&
            (put_byte(buf, 0x28) < 0 || put_byte(buf, 0x01) < 0)) {
            return -1;
        }
        const Entry *lp = frame->entries;
        for (Py_ssize_t i = 0; i < frame->logprobs; i++) {
            Py_ssize_t mark;
            if (begin_len(buf, 0x32, &mark) < 0 ||
                put_logprob(buf, index, strings, lp, float32) < 0 ||
                end_len(buf, mark) < 0) {
                return -1;
            }
            lp += 1 + lp->alternatives;
        }
    }
    if (frame->finish != NULL && put_literal(buf, 0x3A, frame->finish) < 0) {
        return -1;
    }
    if (frame->has_usage) {
        int size = 2 + varint_size(frame->prompt) + varint_size(frame->completion);
        if (put_byte(buf, 0x42) < 0 || put_byte(buf, (uint8_t)size) < 0 ||
            put_byte(buf, 0x08) < 0 || put_varint(buf, frame->prompt) < 0 ||
            put_byte(buf, 0x10) < 0 || put_varint(buf, frame->completion) < 0) {
            return -1;
        }
    }
    return 0;
}

PyDoc_STRVAR(encode_frame_doc,
             "encode_frame(chunk, base, next_seq, offset, index, strings, carries_usage, "
             "float32, /)\n--\n\n"
             "The bytes of chunk's frame, length prefix included, as DeltaStreamEncoder writes "
             "them (its string table, index and strings, updated); None, with nothing changed, "
             "for a chunk the Python path must take.");

static PyObject *
encode_frame(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8) {
        PyErr_SetString(PyExc_TypeError, "encode_frame() takes 8 arguments");
        return NULL;
    }
    PyObject *chunk = args[0], *base = args[1], *next_seq = args[2], *offset_obj = args[3];
    PyObject *index = args[4], *strings = args[5];
    if (require_configured(S.configured, "_delta_accel") < 0) {
        return NULL;
    }
    if (!PyTuple_CheckExact(base) || PyTuple_GET_SIZE(base) != 4 || !PyDict_CheckExact(index) ||
        !PyList_CheckExact(strings)) {
        PyErr_SetString(PyExc_TypeError, "encode_frame() takes a 4-tuple, a dict and a list");
        return NULL;
    }
    int carries_usage = PyObject_IsTrue(args[6]);
    if (carries_usage < 0) {
        return NULL;
    }
    int float32 = PyObject_IsTrue(args[7]);
    if (float32 < 0) {
        return NULL;
    }
    if (!Py_IS_TYPE(chunk, S.chunk.type) || !PyLong_CheckExact(offset_obj)) {
        Py_RETURN_NONE;
    }
    uint64_t offset = PyLong_AsUnsignedLongLong(offset_obj);
    if (offset == (uint64_t)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or past 64 bits: the Python path raises */
        Py_RETURN_NONE;
    }
    Frame frame;
    frame_init(&frame);
    int step = read_chunk(&frame, chunk, base, next_seq, carries_usage);
    if (step == STEP_OK) {
        step = check_strings(&frame, index);
    }
    if (step != STEP_OK) {
        frame_clear(&frame);
        if (step == STEP_ERROR) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    /* The body goes after room for its length prefix, which is then written right before it. */
    Buf buf;
    buf_init(&buf, MAX_VARINT_BYTES);
    PyObject *result = NULL;
    if (put_frame(&buf, &frame, offset, index, strings, float32) == 0) {
        Py_ssize_t body = buf.len - MAX_VARINT_BYTES;
        uint64_t length = (uint64_t)body + 1;
        int size = varint_size(length);
        char *start = buf.data + MAX_VARINT_BYTES - size;
        write_varint(start, length);
        result = PyBytes_FromStringAndSize(start, size + body);
    }
    buf_free(&buf);
    frame_clear(&frame);
    return result;
}

/* ---- decoding ------------------------------------------------------------------------------- */

#define SMALL_PENDING 32

/* The strings a frame adds to the table, held until the whole frame has been read: a frame
 * handed back to Python must leave the table as it found it. */
typedef struct {
    PyObject *strings; /* the table: list[str] */
    Py_ssize_t before;  /* its size when the frame began */
    PyObject **items;
    Py_ssize_t count;
    Py_ssize_t cap;
    PyObject *small[SMALL_PENDING];
} Pending;

static void
pending_init(Pending *pending, PyObject *strings)
{
    pending->strings = strings;
    pending->before = PyList_GET_SIZE(strings);
    pending->items = pending->small;
    pending->count = 0;
    pending->cap = SMALL_PENDING;
}

static void
pending_clear(Pending *pending)
{
    for (Py_ssize_t i = 0; i < pending->count; i++) {
        Py_DECREF(pending->items[i]);
    }
    if (pending->items != pending->small) {
        PyMem_Free(pending->items);
    }
    pending->items = pending->small;
    pending->count = 0;
    pending->cap = SMALL_PENDING;
}

/* StringTable.add: a literal of 1 to max_chars characters joins the table while it has room. */
static int
pending_add(Pending *pending, PyObject *text)
{
    Py_ssize_t length = PyUnicode_GET_LENGTH(text);
    if (!(0 < length && length <= S.max_chars && pending->before + pending->count < S.max_entries)) {
        return 0;
    }
    if (pending->count == pending->cap) {
        Py_ssize_t cap = pending->cap * 2;
        PyObject **items;
        if (pending->items == pending->small) {
            items = PyMem_Malloc(cap * sizeof(PyObject *));
            if (items != NULL) {
                memcpy(items, pending->small, sizeof(pending->small));
            }
        }
        else {
            items = PyMem_Realloc(pending->items, cap * sizeof(PyObject *));
        }
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        pending->items = items;
        pending->cap = cap;
    }
    Py_INCREF(text);
    pending->items[pending->count++] = text;
    return 0;
}

/* StringTable.get: a new reference to entry ref - 1, or NULL (no error set) if there is none. */
static PyObject *
pending_get(Pending *pending, uint64_t ref)
{
    if (ref == 0) {
        return NULL;
    }
    uint64_t at = ref - 1;
    if (at < (uint64_t)pending->before) {
        if (at >= (uint64_t)PyList_GET_SIZE(pending->strings)) {
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(pending->strings, (Py_ssize_t)at));
    }
    at -= (uint64_t)pending->before;
    if (at >= (uint64_t)pending->count) {
        return NULL;
    }
    return Py_NewRef(pending->items[at]);
}

static int
pending_commit(Pending *pending)
{
    for (Py_ssize_t i = 0; i < pending->count; i++) {
        if (PyList_Append(pending->strings, pending->items[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

static int
decimal_value(int64_t mantissa, uint64_t scale, double *out)
{
    if (scale > MAX_SCALE || mantissa >= MAX_EXACT || mantissa <= -MAX_EXACT) {
        return 0; /* _from_decimal's DecodeError */
    }
    *out = (double)mantissa / POW10[scale];
    return 1;
}

/* One Logprob message in data[pos:end], in the encoder's field order (see delta_encoder._logprob):
 * token ref or literal, logprob as a decimal or a double, the top[0]-repeats-token flag, then
 * the other alternatives' refs, literals and packed values. */
static int
parse_logprob(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, Pending *pending, int float32,
              PyObject **out)
{
    int step = STEP_OK;
    PyObject *token = NULL, *value_obj = NULL, *top = NULL;
    uint64_t number = 0;
    /* token */
    if (pos < end && data[pos] == 0x08) {
        pos++;
        BAIL_IF(!read_varint(data, &pos, end, &number) || number == 0);
        token = pending_get(pending, number);
        BAIL_IF(token == NULL);
    }
    else if (pos < end && data[pos] == 0x12) {
        Py_ssize_t start, stop;
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        token = strict_utf8(data, start, stop, &step);
        if (token == NULL) {
            goto done;
        }
        if (pending_add(pending, token) < 0) {
            step = STEP_ERROR;
            goto done;
        }
    }
    else {
        token = Py_NewRef(S.empty);
    }
    /* logprob */
    double value;
    if (pos < end && data[pos] == 0x19) {
        pos++;
        BAIL_IF(end - pos < 8);
        value = PyFloat_Unpack8((const char *)data + pos, 1);
        if (value == -1.0 && PyErr_Occurred()) {
            step = STEP_ERROR;
            goto done;
        }
        pos += 8;
    }
    else if (pos < end && data[pos] == 0x40) {
        uint64_t scale;
        pos++;
        BAIL_IF(!read_varint(data, &pos, end, &number) || pos >= end || data[pos] != 0x48);
        pos++;
        BAIL_IF(!read_varint(data, &pos, end, &scale));
        int64_t mantissa = unzigzag(number);
        BAIL_IF(mantissa == 0 || !decimal_value(mantissa, scale, &value));
    }
    else if (float32 && pos < end && data[pos] == 0x65) {
        pos++;
        BAIL_IF(end - pos < 4);
        value = PyFloat_Unpack4((const char *)data + pos, 1);
        if (value == -1.0 && PyErr_Occurred()) {
            step = STEP_ERROR;
            goto done;
        }
        pos += 4;
    }
    else {
        BAIL_IF(1);
    }
    int top_is_token = 0;
    if (pos < end && data[pos] == 0x20) {
        pos++;
        BAIL_IF(pos >= end || data[pos] != 0x01);
        pos++;
        top_is_token = 1;
    }
    /* the other alternatives: read through once to check them, then again to build */
    Py_ssize_t refs_start = 0, refs_end = 0, literals_start = 0, values_start = 0,
               values_end = 0;
    Py_ssize_t count = 0, literals = 0;
    int width = 0; /* of each value: 8 (doubles), 4 (float32s), 0 (decimals) */
    uint64_t top_scale = 0;
    if (pos < end && data[pos] == 0x2A) {
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &refs_start, &refs_end));
        for (Py_ssize_t at = refs_start; at < refs_end; count++) {
            BAIL_IF(!read_varint(data, &at, refs_end, &number));
            literals += number == 0;
        }
        BAIL_IF(count == 0);
        literals_start = pos;
        for (Py_ssize_t i = 0; i < literals; i++) {
            Py_ssize_t start, stop;
            BAIL_IF(pos >= end || data[pos] != 0x32);
            pos++;
            BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        }
        BAIL_IF(pos >= end);
        if (data[pos] == 0x52) {
            Py_ssize_t values = 0;
            pos++;
            BAIL_IF(!read_len(data, &pos, end, &values_start, &values_end));
            BAIL_IF(pos >= end || data[pos] != 0x58);
            pos++;
            BAIL_IF(!read_varint(data, &pos, end, &top_scale) || top_scale > MAX_SCALE);
            for (Py_ssize_t at = values_start; at < values_end; values++) {
                double unused;
                BAIL_IF(!read_varint(data, &at, values_end, &number) ||
                        !decimal_value(unzigzag(number), top_scale, &unused));
            }
            BAIL_IF(values != count);
        }
        else if (data[pos] == 0x3A) {
            pos++;
            BAIL_IF(!read_len(data, &pos, end, &values_start, &values_end));
            BAIL_IF((uint64_t)(values_end - values_start) != (uint64_t)count * 8);
            width = 8;
        }
        else if (float32 && data[pos] == 0x6A) {
            pos++;
            BAIL_IF(!read_len(data, &pos, end, &values_start, &values_end));
            BAIL_IF((uint64_t)(values_end - values_start) != (uint64_t)count * 4);
            width = 4;
        }
        else {
            BAIL_IF(1);
        }
    }
    BAIL_IF(pos != end);
    /* build */
    if ((value_obj = PyFloat_FromDouble(value)) == NULL ||
        (top = PyTuple_New(top_is_token + count)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    if (top_is_token) {
        PyObject *values[T_FIELDS] = {Py_NewRef(token), Py_NewRef(value_obj)};
        PyObject *first = new_instance(&S.top, values, T_FIELDS);
        if (first == NULL) {
            step = STEP_ERROR;
            goto done;
        }
        PyTuple_SET_ITEM(top, 0, first);
    }
    Py_ssize_t ref_at = refs_start, literal_at = literals_start, value_at = values_start;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *alt_token;
        read_varint(data, &ref_at, refs_end, &number); /* checked above */
        if (number) {
            alt_token = pending_get(pending, number);
            BAIL_IF(alt_token == NULL);
        }
        else {
            Py_ssize_t start = 0, stop = 0;
            literal_at++;
            read_len(data, &literal_at, end, &start, &stop);
            alt_token = strict_utf8(data, start, stop, &step);
            if (alt_token == NULL) {
                goto done;
            }
            if (pending_add(pending, alt_token) < 0) {
                Py_DECREF(alt_token);
                step = STEP_ERROR;
                goto done;
            }
        }
        double alt_value = 0.0;
        if (width) {
            alt_value = width == 8 ? PyFloat_Unpack8((const char *)data + value_at, 1)
                                   : PyFloat_Unpack4((const char *)data + value_at, 1);
            value_at += width;
            if (alt_value == -1.0 && PyErr_Occurred()) {
                Py_DECREF(alt_token);
                step = STEP_ERROR;
                goto done;
            }
        }
        else {
            read_varint(data, &value_at, values_end, &number);
            decimal_value(unzigzag(number), top_scale, &alt_value); /* checked above */
        }
        PyObject *values[T_FIELDS] = {alt_token, PyFloat_FromDouble(alt_value)};
        if (values[1] == NULL) {
            Py_DECREF(alt_token);
            step = STEP_ERROR;
            goto done;
        }
        PyObject *alternative = new_instance(&S.top, values, T_FIELDS);
        if (alternative == NULL) {
            step = STEP_ERROR;
            goto done;
        }
        PyTuple_SET_ITEM(top, top_is_token + i, alternative);
    }
    PyObject *values[L_FIELDS] = {token, value_obj, top};
    token = value_obj = top = NULL;
    if ((*out = new_instance(&S.logprob, values, L_FIELDS)) == NULL) {
        step = STEP_ERROR;
    }
done:
    Py_XDECREF(token);
    Py_XDECREF(value_obj);
    Py_XDECREF(top);
    return step;
}

typedef struct {
    PyObject *header; /* (id, model, created, index, base_seq) */
    uint64_t base_seq;
    int base_seq_fits; /* base_seq below 2**64: the header's varint, always */
    int usage_known;
    int float32; /* wire format 1: the float32 logprob fields are known */
} Stream;

static PyObject *
seq_of(const Stream *stream, uint64_t offset)
{
    if (stream->base_seq_fits && offset <= UINT64_MAX - stream->base_seq) {
        return PyLong_FromUnsignedLongLong(stream->base_seq + offset);
    }
    PyObject *delta = PyLong_FromUnsignedLongLong(offset);
    if (delta == NULL) {
        return NULL;
    }
    PyObject *seq = PyNumber_Add(PyTuple_GET_ITEM(stream->header, 4), delta);
    Py_DECREF(delta);
    return seq;
}

/* One frame in data[pos:end] that must be number `expected` of the stream, in the encoder's
 * field order (see DeltaStreamEncoder._encode). */
static int
parse_frame(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, const Stream *stream,
            uint64_t expected, PyObject *strings, PyObject **out)
{
    int step = STEP_OK;
    Pending pending;
    pending_init(&pending, strings);
    PyObject *token_ids = NULL, *text = NULL, *logprobs = NULL, *finish = NULL, *usage = NULL;
    PyObject *seq = NULL;
    uint64_t number = 0;
    uint64_t offset = 0;
    if (pos < end && data[pos] == 0x08) {
        pos++;
        BAIL_IF(!read_varint(data, &pos, end, &offset));
    }
    BAIL_IF(offset != expected); /* out of turn: the Python path says how */
    /* token ids, packed, or one unpacked (then its varint is the whole run) */
    Py_ssize_t ids_start = 0, ids_end = 0, count = 0;
    if (pos < end && data[pos] == 0x12) {
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &ids_start, &ids_end));
        for (Py_ssize_t at = ids_start; at < ids_end; count++) {
            BAIL_IF(!read_varint(data, &at, ids_end, &number) || number >= UINT32_LIMIT);
        }
    }
    else if (pos < end && data[pos] == 0x10) {
        pos++;
        ids_start = pos;
        BAIL_IF(!read_varint(data, &pos, end, &number) || number >= UINT32_LIMIT);
        ids_end = pos;
        count = 1;
    }
    /* text */
    if (pos < end && data[pos] == 0x18) {
        pos++;
        BAIL_IF(!read_varint(data, &pos, end, &number) || number == 0);
        text = pending_get(&pending, number);
        BAIL_IF(text == NULL);
    }
    else if (pos < end && data[pos] == 0x22) {
        Py_ssize_t start, stop;
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        if ((text = strict_utf8(data, start, stop, &step)) == NULL) {
            goto done;
        }
        if (pending_add(&pending, text) < 0) {
            step = STEP_ERROR;
            goto done;
        }
    }
    else {
        text = Py_NewRef(S.empty);
    }
    /* logprobs: flagged (format 0; format 1 flags only an empty list), or as many as follow */
    int flagged = 0;
    if (pos < end && data[pos] == 0x28) {
        pos++;
        BAIL_IF(pos >= end || data[pos] != 0x01);
        pos++;
        flagged = 1;
    }
    Py_ssize_t entries = 0;
    for (Py_ssize_t at = pos; at < end && data[at] == 0x32; entries++) {
        Py_ssize_t start, stop;
        at++;
        BAIL_IF(!read_len(data, &at, end, &start, &stop));
    }
    if (flagged || entries) {
        if ((logprobs = PyTuple_New(entries)) == NULL) {
            step = STEP_ERROR;
            goto done;
        }
        for (Py_ssize_t i = 0; i < entries; i++) {
            Py_ssize_t start = 0, stop = 0;
            PyObject *entry = NULL;
            pos++;
            read_len(data, &pos, end, &start, &stop); /* checked above */
            if ((step = parse_logprob(data, start, stop, &pending, stream->float32, &entry)) !=
                STEP_OK) {
                goto done;
            }
            PyTuple_SET_ITEM(logprobs, i, entry);
        }
    }
    else {
        logprobs = Py_NewRef(Py_None);
    }
    /* finish reason */
    if (pos < end && data[pos] == 0x3A) {
        Py_ssize_t start, stop;
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        if ((finish = strict_utf8(data, start, stop, &step)) == NULL) {
            goto done;
        }
    }
    else {
        finish = Py_NewRef(Py_None);
    }
    /* usage: `08 <prompt> 10 <completion>`, both below 2**32 */
    if (pos < end && data[pos] == 0x42) {
        Py_ssize_t start, stop;
        uint64_t prompt, completion;
        pos++;
        BAIL_IF(!stream->usage_known || !read_len(data, &pos, end, &start, &stop));
        BAIL_IF(start >= stop || data[start] != 0x08);
        start++;
        BAIL_IF(!read_varint(data, &start, stop, &prompt) || prompt >= UINT32_LIMIT);
        BAIL_IF(start >= stop || data[start] != 0x10);
        start++;
        BAIL_IF(!read_varint(data, &start, stop, &completion) || completion >= UINT32_LIMIT);
        BAIL_IF(start != stop);
        PyObject *values[U_FIELDS] = {PyLong_FromUnsignedLongLong(prompt),
                                      PyLong_FromUnsignedLongLong(completion)};
        if (values[0] == NULL || values[1] == NULL) {
            Py_XDECREF(values[0]);
            Py_XDECREF(values[1]);
            step = STEP_ERROR;
            goto done;
        }
        if ((usage = new_instance(&S.usage, values, U_FIELDS)) == NULL) {
            step = STEP_ERROR;
            goto done;
        }
    }
    else {
        usage = Py_NewRef(Py_None);
    }
    BAIL_IF(pos != end);
    /* build */
    if ((token_ids = PyTuple_New(count)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    for (Py_ssize_t i = 0, at = ids_start; i < count; i++) {
        read_varint(data, &at, ids_end, &number); /* checked above */
        PyObject *token_id = PyLong_FromUnsignedLongLong(number);
        if (token_id == NULL) {
            step = STEP_ERROR;
            goto done;
        }
        PyTuple_SET_ITEM(token_ids, i, token_id);
    }
    if ((seq = seq_of(stream, offset)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    PyObject *header = stream->header;
    PyObject *values[C_FIELDS] = {
        Py_NewRef(PyTuple_GET_ITEM(header, 0)),
        Py_NewRef(PyTuple_GET_ITEM(header, 1)),
        Py_NewRef(PyTuple_GET_ITEM(header, 2)),
        Py_NewRef(PyTuple_GET_ITEM(header, 3)),
        seq,
        token_ids,
        text,
        logprobs,
        finish,
        usage,
    };
    seq = token_ids = text = logprobs = finish = usage = NULL;
    if ((*out = new_instance(&S.chunk, values, C_FIELDS)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    if (pending_commit(&pending) < 0) {
        Py_CLEAR(*out);
        step = STEP_ERROR;
    }
done:
    pending_clear(&pending);
    Py_XDECREF(seq);
    Py_XDECREF(token_ids);
    Py_XDECREF(text);
    Py_XDECREF(logprobs);
    Py_XDECREF(finish);
    Py_XDECREF(usage);
    return step;
}

PyDoc_STRVAR(decode_frames_doc,
             "decode_frames(data, pos, header, strings, count, usage_known, float32, "
             "max_frame_bytes, out, /)\n--\n\n"
             "Decode the whole frames from data[pos:] into out while each is the next of the "
             "stream (count chunks delivered before out) and has the encoder's shape, adding "
             "their strings to the table strings; return where it stopped. The frame there, if "
             "any, is the Python path's: partial, the end marker, too large, out of turn, "
             "invalid, or written by another encoder.");

static PyObject *
decode_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "decode_frames() takes 9 arguments");
        return NULL;
    }
    PyObject *data_obj = args[0], *header = args[2], *strings = args[3], *out = args[8];
    if (require_configured(S.configured, "_delta_accel") < 0) {
        return NULL;
    }
    if (!PyBytes_CheckExact(data_obj) || !PyTuple_CheckExact(header) ||
        PyTuple_GET_SIZE(header) != 5 || !PyList_CheckExact(strings) || !PyList_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError,
                        "decode_frames() takes bytes, a 5-tuple, a list and a list");
        return NULL;
    }
    const uint8_t *data = (const uint8_t *)PyBytes_AS_STRING(data_obj);
    Py_ssize_t end = PyBytes_GET_SIZE(data_obj);
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (pos < 0 || pos > end) {
        PyErr_SetString(PyExc_ValueError, "pos outside data");
        return NULL;
    }
    uint64_t count = PyLong_AsUnsignedLongLong(args[4]);
    if (count == (uint64_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    int usage_known = PyObject_IsTrue(args[5]);
    if (usage_known < 0) {
        return NULL;
    }
    int float32 = PyObject_IsTrue(args[6]);
    if (float32 < 0) {
        return NULL;
    }
    int overflow;
    long long max_frame_bytes = PyLong_AsLongLongAndOverflow(args[7], &overflow);
    if (max_frame_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow > 0) {
        max_frame_bytes = LLONG_MAX;
    }
    if (overflow < 0 || max_frame_bytes < 0) {
        return PyLong_FromSsize_t(pos); /* a limit nothing fits: Python raises */
    }
    Stream stream = {header, 0, 0, usage_known, float32};
    PyObject *base_seq = PyTuple_GET_ITEM(header, 4);
    if (PyLong_CheckExact(base_seq)) {
        stream.base_seq = PyLong_AsUnsignedLongLong(base_seq);
        if (stream.base_seq == (uint64_t)-1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        else {
            stream.base_seq_fits = 1;
        }
    }
    while (pos < end) {
        Py_ssize_t body = pos;
        uint64_t length;
        if (!read_varint(data, &body, end, &length) || length == 0 ||
            length - 1 > (uint64_t)max_frame_bytes || length - 1 > (uint64_t)(end - body)) {
            break; /* cut, the end marker, too large, or not all here */
        }
        Py_ssize_t frame_end = body + (Py_ssize_t)(length - 1);
        uint64_t expected = count + (uint64_t)PyList_GET_SIZE(out);
        if (expected < count) {
            break; /* past 2**64 chunks: no offset can say it */
        }
        PyObject *chunk = NULL;
        int step = parse_frame(data, body, frame_end, &stream, expected, strings, &chunk);
        if (step == STEP_ERROR) {
            return NULL;
        }
        if (step == STEP_BAIL) {
            break;
        }
        int failed = PyList_Append(out, chunk);
        Py_DECREF(chunk);
        if (failed) {
            return NULL;
        }
        pos = frame_end;
    }
    return PyLong_FromSsize_t(pos);
}

PyDoc_STRVAR(decimal_doc,
             "decimal(value, /)\n--\n\n"
             "delta_wire.to_decimal(value): (mantissa, scale) or None. For tests.");

static PyObject *
decimal_py(PyObject *module, PyObject *arg)
{
    double value = PyFloat_AsDouble(arg);
    if (value == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    int64_t mantissa;
    int scale;
    int found = decimal(value, &mantissa, &scale);
    if (found < 0) {
        return NULL;
    }
    if (!found) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(Li)", (long long)mantissa, scale);
}

static PyMethodDef methods[] = {
    {"configure", FASTCALL(configure), METH_FASTCALL,
     "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, max_entries, max_chars, /)\n--\n\n"
     "Bind the model classes and the string table's limits; call once before the rest."},
    {"encode_frame", FASTCALL(encode_frame), METH_FASTCALL, encode_frame_doc},
    {"decode_frames", FASTCALL(decode_frames), METH_FASTCALL, decode_frames_doc},
    {"decimal", decimal_py, METH_O, decimal_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.codecs._delta_accel",
    .m_doc = "The delta codec's per-frame work, compiled (see codecs/delta_codec.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__delta_accel(void)
{
    return module_with_version(&module_def, API_VERSION);
}
