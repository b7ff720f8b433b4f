/* _protobuf_accel: the protobuf codec's TokenChunk marshalling, compiled.
 *
 * Why: on the upb backend, parsing and serializing a one-token chunk of stream-256 take upb
 * about 0.2 us each, but building the upb message from the model objects (0.7 us) and the
 * model objects from it (1.0 us) take four to five times that, in Python. This module writes
 * and reads the wire format of schemas/inferwire.proto's TokenChunk directly from and into the
 * model objects of codecs/model.py, and nothing else; upb stays the reference and the fallback
 * (codecs/protobuf_codec.py).
 *
 *   encode_chunk  a TokenChunk -> exactly the bytes upb's SerializeToString writes for it:
 *                 fields in field-number order, proto3 defaults left out (a double when its
 *                 bits are all zero, so -0.0 is written), token_ids packed, logprobs present
 *                 but empty written as an empty message, finish_reason (proto3 optional)
 *                 written when present, even empty.
 *   decode_chunk  those bytes -> the TokenChunk the upb path builds from them.
 *
 * What it takes: objects of exactly the model classes, with values of exactly the types the
 * model declares (str, int, float, tuple or list) and in their field's range. Anything else (a
 * subclass, a value upb converts or refuses, a lone surrogate, an integer out of range) is
 * handed back: encode_chunk returns None and the upb path encodes it or raises its EncodeError.
 *
 * decode_chunk takes only the canonical encoding, the one upb writes: each field at most once
 * and in field-number order, no default value written, token_ids packed, the wire types of the
 * schema, valid UTF-8, and no more repeated entries than the element budget. Anything else (an
 * unknown field, a field repeated or out of order, truncation, a value of 2**32 or more in a
 * uint32, a budget broken) is handed back, returning None: upb then applies protobuf's merge
 * rules or raises, and the codec its typed error. So whenever this module returns a chunk, it
 * is the chunk the upb path returns; when in doubt it returns None.
 *
 * Hostile bytes: every read is bounds-checked against the message it belongs to (also when a
 * span is read a second time to build what the first read counted, since a bytearray's content
 * could change in between), varints stop at 10 bytes and 64 bits, and the nesting is the
 * schema's (three levels), never the input's. The only exceptions raised are MemoryError, and
 * TypeError or RuntimeError for a call with the wrong arguments or before configure().
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h> /* T_OBJECT_EX, READONLY */

#include <stdint.h>
#include <string.h>

#include "_extension.h"
#include "_model_slots.h"
#include "_wire_buf.h"

/* Bumped when an argument list changes: protobuf_codec ignores a stale build that disagrees. */
#define API_VERSION 1

#define UINT32_LIMIT ((uint64_t)1 << 32)
/* protobuf's 2 GiB message limit: larger goes to upb, which says what it does with it. */
#define MAX_MESSAGE ((Py_ssize_t)0x7FFFFFFF)

/* ---- the model classes, read and written through their slots ------------------------------ */


static struct {
    int configured;
    ModelClass chunk, logprob, top, usage;
    PyObject *empty; /* "" */
} S;

/* A field of a model object: a borrowed reference, NULL if never set. */
#define FIELD(obj, cls, field) (*(PyObject **)((char *)(obj) + S.cls.offsets[field]))

static PyObject *
configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    S.configured = 0; /* until every class is bound: never half-bound */
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError,
                        "configure(TokenChunk, TokenLogprob, TopLogprob, Usage)");
        return NULL;
    }
    if (bind_chunk_classes(&S.chunk, &S.logprob, &S.top, &S.usage, args, 1) < 0) {
        return NULL;
    }
    if (S.empty == NULL && (S.empty = PyUnicode_FromStringAndSize("", 0)) == NULL) {
        return NULL;
    }
    S.configured = 1;
    Py_RETURN_NONE;
}

/* ---- encoding: the output buffer ------------------------------------------------------------ */

/* A one-byte key (every field number here is below 16), then a varint. */
static inline int
put_key_varint(Buf *buf, uint8_t key, uint64_t value)
{
    TRY(buf_reserve(buf, 1 + MAX_VARINT_BYTES));
    buf->data[buf->len++] = (char)key;
    write_varint(buf->data + buf->len, value);
    buf->len += varint_size(value);
    return STEP_OK;
}

/* A string field: an exact str, written when not empty (or always, for a field with presence).
 * A str that has no UTF-8 (a lone surrogate) goes to upb, which raises for it. */
static int
put_string(Buf *buf, uint8_t key, PyObject *text, int always)
{
    if (!PyUnicode_CheckExact(text)) {
        return STEP_BAIL;
    }
    Py_ssize_t size;
    const char *raw = PyUnicode_AsUTF8AndSize(text, &size);
    if (raw == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
            PyErr_Clear();
            return STEP_BAIL;
        }
        return STEP_ERROR;
    }
    if (size == 0 && !always) {
        return STEP_OK;
    }
    if (size > MAX_MESSAGE) {
        return STEP_BAIL;
    }
    TRY(put_key_varint(buf, key, (uint64_t)size));
    TRY(buf_reserve(buf, size));
    memcpy(buf->data + buf->len, raw, size);
    buf->len += size;
    return STEP_OK;
}

/* A double field (fixed64, little-endian): an exact float, written unless its bits are all zero
 * (upb's test for a proto3 default: -0.0 is written, 0.0 is not). */
static int
put_double(Buf *buf, uint8_t key, PyObject *value)
{
    if (!PyFloat_CheckExact(value)) {
        return STEP_BAIL;
    }
    char bits[8];
    if (PyFloat_Pack8(PyFloat_AS_DOUBLE(value), bits, 1) < 0) {
        return STEP_ERROR;
    }
    static const char zero[8] = {0};
    if (memcmp(bits, zero, 8) == 0) {
        return STEP_OK;
    }
    TRY(buf_reserve(buf, 9));
    buf->data[buf->len++] = (char)key;
    memcpy(buf->data + buf->len, bits, 8);
    buf->len += 8;
    return STEP_OK;
}

/* An exact int in [0, limit) (limit 0: [0, 2**64)). */
static int
unsigned_value(PyObject *value, uint64_t limit, uint64_t *out)
{
    if (!PyLong_CheckExact(value)) {
        return STEP_BAIL;
    }
    uint64_t number = PyLong_AsUnsignedLongLong(value);
    if (number == (uint64_t)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return STEP_ERROR;
        }
        PyErr_Clear(); /* negative or past 64 bits: upb's ValueError */
        return STEP_BAIL;
    }
    if (limit && number >= limit) {
        return STEP_BAIL;
    }
    *out = number;
    return STEP_OK;
}

static int
put_unsigned(Buf *buf, uint8_t key, PyObject *value, uint64_t limit)
{
    uint64_t number = 0;
    TRY(unsigned_value(value, limit, &number));
    return number ? put_key_varint(buf, key, number) : STEP_OK;
}

/* An exact tuple or list (iterated by upb's path, whatever its type); its items are read while
 * no Python code can run, so a list cannot change under us. */
static inline int
is_sequence(PyObject *value)
{
    return PyTuple_CheckExact(value) || PyList_CheckExact(value);
}

static int
put_top(Buf *buf, PyObject *top)
{
    if (!Py_IS_TYPE(top, S.top.type)) {
        return STEP_BAIL;
    }
    PyObject *token = FIELD(top, top, T_TOKEN), *value = FIELD(top, top, T_LOGPROB);
    if (token == NULL || value == NULL) {
        return STEP_BAIL;
    }
    Py_ssize_t mark;
    TRY(begin_len(buf, 0x1A, &mark));
    TRY(put_string(buf, 0x0A, token, 0));
    TRY(put_double(buf, 0x11, value));
    return end_len(buf, mark);
}

static int
put_logprob(Buf *buf, PyObject *lp)
{
    if (!Py_IS_TYPE(lp, S.logprob.type)) {
        return STEP_BAIL;
    }
    PyObject *token = FIELD(lp, logprob, L_TOKEN), *value = FIELD(lp, logprob, L_LOGPROB);
    PyObject *top = FIELD(lp, logprob, L_TOP);
    if (token == NULL || value == NULL || top == NULL || !is_sequence(top)) {
        return STEP_BAIL;
    }
    Py_ssize_t mark;
    TRY(begin_len(buf, 0x0A, &mark));
    TRY(put_string(buf, 0x0A, token, 0));
    TRY(put_double(buf, 0x11, value));
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(top); i++) {
        TRY(put_top(buf, PySequence_Fast_GET_ITEM(top, i)));
    }
    return end_len(buf, mark);
}

static int
put_chunk(Buf *buf, PyObject *chunk)
{
    PyObject *f[C_FIELDS];
    for (int i = 0; i < C_FIELDS; i++) {
        if ((f[i] = FIELD(chunk, chunk, i)) == NULL) {
            return STEP_BAIL; /* an unset slot: upb's path raises AttributeError */
        }
    }
    TRY(put_string(buf, 0x0A, f[C_ID], 0));
    TRY(put_string(buf, 0x12, f[C_MODEL], 0));
    /* created: int64, negative as its two's complement in ten bytes */
    if (!PyLong_CheckExact(f[C_CREATED])) {
        return STEP_BAIL;
    }
    int overflow;
    long long created = PyLong_AsLongLongAndOverflow(f[C_CREATED], &overflow);
    if (created == -1 && PyErr_Occurred()) {
        return STEP_ERROR;
    }
    if (overflow) {
        return STEP_BAIL;
    }
    if (created) {
        TRY(put_key_varint(buf, 0x18, (uint64_t)created));
    }
    TRY(put_unsigned(buf, 0x20, f[C_INDEX], UINT32_LIMIT));
    TRY(put_unsigned(buf, 0x28, f[C_SEQ], 0));
    /* token_ids: packed */
    PyObject *token_ids = f[C_TOKEN_IDS];
    if (!is_sequence(token_ids)) {
        return STEP_BAIL;
    }
    if (PySequence_Fast_GET_SIZE(token_ids)) {
        Py_ssize_t mark;
        TRY(begin_len(buf, 0x32, &mark));
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(token_ids); i++) {
            uint64_t token_id = 0;
            TRY(unsigned_value(PySequence_Fast_GET_ITEM(token_ids, i), UINT32_LIMIT, &token_id));
            TRY(put_varint(buf, token_id));
        }
        TRY(end_len(buf, mark));
    }
    TRY(put_string(buf, 0x3A, f[C_TEXT], 0));
    /* logprobs: a Logprobs message when present, even empty */
    PyObject *logprobs = f[C_LOGPROBS];
    if (logprobs != Py_None) {
        if (!is_sequence(logprobs)) {
            return STEP_BAIL;
        }
        Py_ssize_t mark;
        TRY(begin_len(buf, 0x42, &mark));
        for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(logprobs); i++) {
            TRY(put_logprob(buf, PySequence_Fast_GET_ITEM(logprobs, i)));
        }
        TRY(end_len(buf, mark));
    }
    /* finish_reason: proto3 optional, written when present */
    if (f[C_FINISH] != Py_None) {
        TRY(put_string(buf, 0x4A, f[C_FINISH], 1));
    }
    PyObject *usage = f[C_USAGE];
    if (usage != Py_None) {
        if (!Py_IS_TYPE(usage, S.usage.type)) {
            return STEP_BAIL;
        }
        PyObject *prompt = FIELD(usage, usage, U_PROMPT);
        PyObject *completion = FIELD(usage, usage, U_COMPLETION);
        if (prompt == NULL || completion == NULL) {
            return STEP_BAIL;
        }
        Py_ssize_t mark;
        TRY(begin_len(buf, 0x52, &mark));
        TRY(put_unsigned(buf, 0x08, prompt, UINT32_LIMIT));
        TRY(put_unsigned(buf, 0x10, completion, UINT32_LIMIT));
        TRY(end_len(buf, mark));
    }
    return buf->len > MAX_MESSAGE ? STEP_BAIL : STEP_OK;
}

PyDoc_STRVAR(encode_chunk_doc,
             "encode_chunk(chunk, /)\n--\n\n"
             "The bytes upb's SerializeToString writes for chunk's TokenChunk message, or None "
             "for anything this module does not take (not exactly a TokenChunk, a value of "
             "another type or out of its field's range): the upb path's.");

static PyObject *
encode_chunk(PyObject *module, PyObject *chunk)
{
    (void)module;
    if (require_configured(S.configured, "_protobuf_accel") < 0) {
        return NULL;
    }
    if (!Py_IS_TYPE(chunk, S.chunk.type)) {
        Py_RETURN_NONE;
    }
    Buf buf;
    buf_init(&buf, 0);
    PyObject *result = NULL;
    int step = put_chunk(&buf, chunk);
    if (step == STEP_OK) {
        result = PyBytes_FromStringAndSize(buf.data, buf.len);
    }
    else if (step == STEP_BAIL) {
        result = Py_NewRef(Py_None);
    }
    buf_free(&buf);
    return result;
}

/* ---- decoding ------------------------------------------------------------------------------- */

/* A length-delimited payload at *pos: [*start, *stop) inside end, and *pos past it. */
static inline int
read_len(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t *start,
         Py_ssize_t *stop)
{
    uint64_t length;
    Py_ssize_t at = *pos;
    /* upb reads a length in at most 5 bytes and below 2**31 (_upb_WireReader_ReadLongSize) and
     * refuses a longer one as corrupt: such input goes back to it. */
    if (!read_varint(data, pos, end, &length) || *pos - at > 5 || length > INT32_MAX ||
        length > (uint64_t)(end - *pos)) {
        return 0;
    }
    *start = *pos;
    *stop = *pos + (Py_ssize_t)length;
    *pos = *stop;
    return 1;
}

/* Strict UTF-8, the empty string shared: the str, or NULL with STEP_BAIL in *step (invalid:
 * upb raises) or STEP_ERROR. */
static PyObject *
utf8(const uint8_t *data, Py_ssize_t start, Py_ssize_t stop, int *step)
{
    if (start == stop) {
        return Py_NewRef(S.empty);
    }
    return strict_utf8(data, start, stop, step);
}

/* A string field written by upb: not empty (an empty one is the default, never written). */
static int
read_string(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, PyObject **out)
{
    Py_ssize_t start, stop;
    if (!read_len(data, pos, end, &start, &stop) || start == stop) {
        return STEP_BAIL;
    }
    int step = STEP_OK;
    *out = utf8(data, start, stop, &step);
    return step;
}

/* A double field written by upb: 8 bytes, not all zero. */
static int
read_double(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, double *out)
{
    static const uint8_t zero[8] = {0};
    if (end - *pos < 8 || memcmp(data + *pos, zero, 8) == 0) {
        return STEP_BAIL;
    }
    double value = PyFloat_Unpack8((const char *)data + *pos, 1);
    if (value == -1.0 && PyErr_Occurred()) {
        return STEP_ERROR;
    }
    *out = value;
    *pos += 8;
    return STEP_OK;
}

/* How many entries of one key run from pos to end, each a length-delimited payload: the count
 * of a repeated message field that ends its message. -1: something else is there. */
static Py_ssize_t
count_entries(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, uint8_t key)
{
    Py_ssize_t count = 0;
    while (pos < end) {
        Py_ssize_t start, stop;
        if (data[pos] != key) {
            return -1;
        }
        pos++;
        if (!read_len(data, &pos, end, &start, &stop)) {
            return -1;
        }
        count++;
    }
    return count;
}

/* What TopLogprob and TokenLogprob begin with: token = 1 (else ""), logprob = 2 (else 0.0).
 * *token: a new reference, or NULL unless STEP_OK. */
static int
read_token_logprob(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, PyObject **token,
                   double *value)
{
    if (*pos < end && data[*pos] == 0x0A) {
        (*pos)++;
        int step = read_string(data, pos, end, token);
        if (step != STEP_OK) {
            return step;
        }
    }
    else {
        *token = Py_NewRef(S.empty);
    }
    if (*pos < end && data[*pos] == 0x11) {
        (*pos)++;
        int step = read_double(data, pos, end, value);
        if (step != STEP_OK) {
            Py_CLEAR(*token);
            return step;
        }
    }
    return STEP_OK;
}

/* TopLogprob: token = 1, logprob = 2. */
static int
parse_top(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, PyObject **out)
{
    int step = STEP_OK;
    PyObject *token = NULL;
    double value = 0.0;
    if ((step = read_token_logprob(data, &pos, end, &token, &value)) != STEP_OK) {
        goto done;
    }
    BAIL_IF(pos != end);
    PyObject *values[T_FIELDS] = {token, PyFloat_FromDouble(value)};
    token = NULL;
    if (values[1] == NULL) {
        Py_DECREF(values[0]);
        return STEP_ERROR;
    }
    if ((*out = new_instance(&S.top, values, T_FIELDS)) == NULL) {
        return STEP_ERROR;
    }
done:
    Py_XDECREF(token);
    return step;
}

/* TokenLogprob: token = 1, logprob = 2, repeated top = 3 (the last field: its entries run to
 * the end). *left: the element budget still unspent. */
static int
parse_logprob(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, uint64_t *left,
              PyObject **out)
{
    int step = STEP_OK;
    PyObject *token = NULL, *top = NULL;
    double value = 0.0;
    if ((step = read_token_logprob(data, &pos, end, &token, &value)) != STEP_OK) {
        goto done;
    }
    Py_ssize_t count = count_entries(data, pos, end, 0x1A);
    BAIL_IF(count < 0 || (uint64_t)count > *left);
    *left -= (uint64_t)count;
    if ((top = PyTuple_New(count)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t start, stop;
        PyObject *entry = NULL;
        BAIL_IF(pos >= end || data[pos] != 0x1A);
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        if ((step = parse_top(data, start, stop, &entry)) != STEP_OK) {
            goto done;
        }
        PyTuple_SET_ITEM(top, i, entry);
    }
    BAIL_IF(pos != end);
    PyObject *values[L_FIELDS] = {token, PyFloat_FromDouble(value), top};
    token = top = NULL;
    if (values[1] == NULL) {
        Py_DECREF(values[0]);
        Py_DECREF(values[2]);
        return STEP_ERROR;
    }
    if ((*out = new_instance(&S.logprob, values, L_FIELDS)) == NULL) {
        return STEP_ERROR;
    }
done:
    Py_XDECREF(token);
    Py_XDECREF(top);
    return step;
}

/* Logprobs: repeated content = 1, possibly none. */
static int
parse_logprobs(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, uint64_t *left,
               PyObject **out)
{
    int step = STEP_OK;
    Py_ssize_t count = count_entries(data, pos, end, 0x0A);
    if (count < 0 || (uint64_t)count > *left) {
        return STEP_BAIL;
    }
    *left -= (uint64_t)count;
    PyObject *content = PyTuple_New(count);
    if (content == NULL) {
        return STEP_ERROR;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t start, stop;
        PyObject *entry = NULL;
        BAIL_IF(pos >= end || data[pos] != 0x0A);
        pos++;
        BAIL_IF(!read_len(data, &pos, end, &start, &stop));
        if ((step = parse_logprob(data, start, stop, left, &entry)) != STEP_OK) {
            goto done;
        }
        PyTuple_SET_ITEM(content, i, entry);
    }
    BAIL_IF(pos != end);
    *out = content;
    return STEP_OK;
done:
    Py_DECREF(content);
    return step;
}

/* A uint32 field written by upb: not zero, below 2**32 (upb would keep the low 32 bits). */
static int
read_uint32(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out)
{
    return read_varint(data, pos, end, out) && *out && *out < UINT32_LIMIT ? STEP_OK
                                                                             : STEP_BAIL;
}

/* Usage: prompt_tokens = 1, completion_tokens = 2. */
static int
parse_usage(const uint8_t *data, Py_ssize_t pos, Py_ssize_t end, PyObject **out)
{
    uint64_t prompt = 0, completion = 0;
    if (pos < end && data[pos] == 0x08) {
        pos++;
        TRY(read_uint32(data, &pos, end, &prompt));
    }
    if (pos < end && data[pos] == 0x10) {
        pos++;
        TRY(read_uint32(data, &pos, end, &completion));
    }
    if (pos != end) {
        return STEP_BAIL;
    }
    PyObject *values[U_FIELDS] = {PyLong_FromUnsignedLongLong(prompt),
                                  PyLong_FromUnsignedLongLong(completion)};
    if (values[0] == NULL || values[1] == NULL) {
        Py_XDECREF(values[0]);
        Py_XDECREF(values[1]);
        return STEP_ERROR;
    }
    return (*out = new_instance(&S.usage, values, U_FIELDS)) == NULL ? STEP_ERROR : STEP_OK;
}

/* TokenChunk, fields 1-10, each at most once and in order. */
static int
parse_chunk(const uint8_t *data, Py_ssize_t end, uint64_t left, PyObject **out)
{
    int step = STEP_OK;
    PyObject *v[C_FIELDS] = {NULL};
    int64_t created = 0;
    uint64_t index = 0, seq = 0, number = 0;
    Py_ssize_t ids_start = 0, ids_stop = 0, count = 0;
    Py_ssize_t pos = 0;
    int last = 0;
    while (pos < end) {
        uint8_t key = data[pos++];
        int field = key >> 3;
        BAIL_IF(key >= 0x80 || field <= last); /* field numbers here fit a one-byte key */
        last = field;
        switch (key) {
        case 0x0A: /* id */
            if ((step = read_string(data, &pos, end, &v[C_ID])) != STEP_OK) {
                goto done;
            }
            break;
        case 0x12: /* model */
            if ((step = read_string(data, &pos, end, &v[C_MODEL])) != STEP_OK) {
                goto done;
            }
            break;
        case 0x18: /* created: int64, the varint's 64 bits as two's complement (upb's cast) */
            BAIL_IF(!read_varint(data, &pos, end, &number) || number == 0);
            created = (int64_t)number;
            break;
        case 0x20: /* index */
            if ((step = read_uint32(data, &pos, end, &index)) != STEP_OK) {
                goto done;
            }
            break;
        case 0x28: /* seq */
            BAIL_IF(!read_varint(data, &pos, end, &seq) || seq == 0);
            break;
        case 0x32: /* token_ids, packed: counted here, built below */
            BAIL_IF(!read_len(data, &pos, end, &ids_start, &ids_stop) || ids_start == ids_stop);
            for (Py_ssize_t at = ids_start; at < ids_stop; count++) {
                BAIL_IF(!read_varint(data, &at, ids_stop, &number) || number >= UINT32_LIMIT);
            }
            BAIL_IF((uint64_t)count > left);
            left -= (uint64_t)count;
            break;
        case 0x3A: /* text */
            if ((step = read_string(data, &pos, end, &v[C_TEXT])) != STEP_OK) {
                goto done;
            }
            break;
        case 0x42: { /* logprobs */
            Py_ssize_t start, stop;
            BAIL_IF(!read_len(data, &pos, end, &start, &stop));
            if ((step = parse_logprobs(data, start, stop, &left, &v[C_LOGPROBS])) != STEP_OK) {
                goto done;
            }
            break;
        }
        case 0x4A: { /* finish_reason: optional, so present even when empty */
            Py_ssize_t start, stop;
            BAIL_IF(!read_len(data, &pos, end, &start, &stop));
            if ((v[C_FINISH] = utf8(data, start, stop, &step)) == NULL) {
                goto done;
            }
            break;
        }
        case 0x52: { /* usage */
            Py_ssize_t start, stop;
            BAIL_IF(!read_len(data, &pos, end, &start, &stop));
            if ((step = parse_usage(data, start, stop, &v[C_USAGE])) != STEP_OK) {
                goto done;
            }
            break;
        }
        default: /* an unknown field, or a known one with another wire type */
            BAIL_IF(1);
        }
    }
    if ((v[C_TOKEN_IDS] = PyTuple_New(count)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    for (Py_ssize_t i = 0, at = ids_start; i < count; i++) {
        /* counted above, read again, and checked again: the input may be a bytearray that
         * a collection run by an allocation since (a __del__) rewrote in place */
        BAIL_IF(!read_varint(data, &at, ids_stop, &number) || number >= UINT32_LIMIT);
        PyObject *token_id = PyLong_FromUnsignedLongLong(number);
        if (token_id == NULL) {
            step = STEP_ERROR;
            goto done;
        }
        PyTuple_SET_ITEM(v[C_TOKEN_IDS], i, token_id);
    }
    if ((v[C_CREATED] = PyLong_FromLongLong(created)) == NULL ||
        (v[C_INDEX] = PyLong_FromUnsignedLongLong(index)) == NULL ||
        (v[C_SEQ] = PyLong_FromUnsignedLongLong(seq)) == NULL) {
        step = STEP_ERROR;
        goto done;
    }
    for (int i = 0; i < C_FIELDS; i++) {
        if (v[i] == NULL) { /* absent: the default */
            int is_string = i == C_ID || i == C_MODEL || i == C_TEXT;
            v[i] = Py_NewRef(is_string ? S.empty : Py_None);
        }
    }
    *out = new_instance(&S.chunk, v, C_FIELDS);
    return *out == NULL ? STEP_ERROR : STEP_OK;
done:
    for (int i = 0; i < C_FIELDS; i++) {
        Py_XDECREF(v[i]);
    }
    return step;
}

PyDoc_STRVAR(decode_chunk_doc,
             "decode_chunk(data, max_elements, /)\n--\n\n"
             "The TokenChunk in data (bytes, bytearray or memoryview) when it is encoded as upb "
             "writes it, with at most max_elements repeated entries; else None, for the upb "
             "path to decode or refuse.");

static PyObject *
decode_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "decode_chunk() takes 2 arguments");
        return NULL;
    }
    if (require_configured(S.configured, "_protobuf_accel") < 0) {
        return NULL;
    }
    PyObject *obj = args[0];
    if (!PyLong_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_chunk() takes an int budget");
        return NULL;
    }
    int overflow;
    long long budget = PyLong_AsLongLongAndOverflow(args[1], &overflow);
    if (budget == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow < 0 || (!overflow && budget < 0)) {
        Py_RETURN_NONE; /* a budget nothing meets: upb's path says so */
    }
    uint64_t left = overflow ? UINT64_MAX : (uint64_t)budget;
    Py_buffer view;
    const uint8_t *data;
    Py_ssize_t size;
    int have_view = 0;
    if (PyBytes_CheckExact(obj)) {
        data = (const uint8_t *)PyBytes_AS_STRING(obj);
        size = PyBytes_GET_SIZE(obj);
    }
    else if (PyByteArray_CheckExact(obj) || PyMemoryView_Check(obj)) {
        /* a contiguous buffer (upb's path reads a memoryview's bytes in C order: the same) */
        if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* not contiguous, or released: upb's path says how */
            Py_RETURN_NONE;
        }
        have_view = 1;
        data = (const uint8_t *)view.buf;
        size = view.len;
    }
    else {
        Py_RETURN_NONE;
    }
    PyObject *chunk = NULL;
    int step = size > MAX_MESSAGE ? STEP_BAIL : parse_chunk(data, size, left, &chunk);
    if (have_view) {
        PyBuffer_Release(&view);
    }
    if (step == STEP_ERROR) {
        return NULL;
    }
    if (step == STEP_BAIL) {
        Py_RETURN_NONE;
    }
    return chunk;
}

static PyMethodDef methods[] = {
    {"configure", FASTCALL(configure), METH_FASTCALL,
     "configure(TokenChunk, TokenLogprob, TopLogprob, Usage, /)\n--\n\n"
     "Bind the model classes; call once before the rest."},
    {"encode_chunk", encode_chunk, METH_O, encode_chunk_doc},
    {"decode_chunk", FASTCALL(decode_chunk), METH_FASTCALL, decode_chunk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "inferwire.codecs._protobuf_accel",
    .m_doc = "The protobuf codec's TokenChunk marshalling, compiled (see "
             "codecs/protobuf_codec.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC
PyInit__protobuf_accel(void)
{
    return module_with_version(&module_def, API_VERSION);
}
