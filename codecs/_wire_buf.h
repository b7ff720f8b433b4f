/* Protocol Buffers wire primitives over a growable output buffer, for the C extensions that
 * write and read protobuf wire format by hand: the delta codec's frames (_delta_accel.c) and
 * the protobuf codec's token chunks (_protobuf_accel.c). Each is a module of its own, so these
 * functions are static. Writers return 0, or -1 with an exception set (MemoryError);
 * read_varint returns 1, or 0 for bytes that are not a varint of at most 64 bits. */
#ifndef INFERWIRE_WIRE_BUF_H
#define INFERWIRE_WIRE_BUF_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_extension.h" /* STEP_BAIL, STEP_ERROR */

#define MAX_VARINT_BYTES 10
#define SMALL_BUF 512

/* Output bytes: on the stack up to SMALL_BUF, then on the heap. */
typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
    char small[SMALL_BUF];
} Buf;

/* An empty buffer, or one whose first `reserved` bytes are left for the caller to fill. */
static inline void
buf_init(Buf *buf, Py_ssize_t reserved)
{
    buf->data = buf->small;
    buf->cap = SMALL_BUF;
    buf->len = reserved;
}

static inline void
buf_free(Buf *buf)
{
    if (buf->data != buf->small) {
        PyMem_Free(buf->data);
    }
}

static int
buf_grow(Buf *buf, Py_ssize_t extra)
{
    if (extra > PY_SSIZE_T_MAX / 4 - buf->len) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t need = buf->len + extra;
    Py_ssize_t cap = buf->cap;
    while (cap < need) {
        cap *= 2;
    }
    char *data;
    if (buf->data == buf->small) {
        data = PyMem_Malloc(cap);
        if (data != NULL) {
            memcpy(data, buf->small, buf->len);
        }
    }
    else {
        data = PyMem_Realloc(buf->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buf->data = data;
    buf->cap = cap;
    return 0;
}

static inline int
buf_reserve(Buf *buf, Py_ssize_t extra)
{
    return buf->cap - buf->len >= extra ? 0 : buf_grow(buf, extra);
}

static inline int
put_byte(Buf *buf, uint8_t byte)
{
    if (buf_reserve(buf, 1) < 0) {
        return -1;
    }
    buf->data[buf->len++] = (char)byte;
    return 0;
}

static inline int
varint_size(uint64_t value)
{
    int size = 1;
    while (value >= 0x80) {
        value >>= 7;
        size++;
    }
    return size;
}

/* The varint of value at out, which has room for varint_size(value) bytes. */
static inline void
write_varint(char *out, uint64_t value)
{
    while (value >= 0x80) {
        *out++ = (char)((value & 0x7F) | 0x80);
        value >>= 7;
    }
    *out = (char)value;
}

static inline int
put_varint(Buf *buf, uint64_t value)
{
    if (buf_reserve(buf, MAX_VARINT_BYTES) < 0) {
        return -1;
    }
    if (value < 0x80) {
        buf->data[buf->len++] = (char)value;
        return 0;
    }
    write_varint(buf->data + buf->len, value);
    buf->len += varint_size(value);
    return 0;
}

/* The varint at *pos (before end) into *out, and *pos past it. */
static inline int
read_varint(const uint8_t *data, Py_ssize_t *pos, Py_ssize_t end, uint64_t *out)
{
    Py_ssize_t at = *pos;
    if (at < end && data[at] < 0x80) {
        *out = data[at];
        *pos = at + 1;
        return 1;
    }
    uint64_t value = 0;
    for (int i = 0; i < MAX_VARINT_BYTES; i++) {
        if (at >= end) {
            return 0;
        }
        uint8_t byte = data[at++];
        if (i == MAX_VARINT_BYTES - 1 && byte > 1) {
            return 0; /* past 64 bits, or an 11th byte */
        }
        value |= (uint64_t)(byte & 0x7F) << (7 * i);
        if (byte < 0x80) {
            *out = value;
            *pos = at;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's key and a one-byte length placeholder at *mark; end_len fills
 * in the length once the payload is written, widening the placeholder where it must. */
static inline int
begin_len(Buf *buf, uint8_t key, Py_ssize_t *mark)
{
    if (buf_reserve(buf, 2) < 0) {
        return -1;
    }
    buf->data[buf->len++] = (char)key;
    buf->data[buf->len++] = 0;
    *mark = buf->len - 1;
    return 0;
}

static int
end_len(Buf *buf, Py_ssize_t mark)
{
    Py_ssize_t length = buf->len - mark - 1;
    if (length < 0x80) {
        buf->data[mark] = (char)length;
        return 0;
    }
    int size = varint_size((uint64_t)length);
    if (buf_reserve(buf, size - 1) < 0) {
        return -1;
    }
    memmove(buf->data + mark + size, buf->data + mark + 1, length);
    write_varint(buf->data + mark, (uint64_t)length);
    buf->len += size - 1;
    return 0;
}

/* A string field's bytes data[start:stop] as strict UTF-8 (bytes.decode()): the str, or NULL
 * with STEP_BAIL in *step (invalid: the reference raises its error) or STEP_ERROR. */
static PyObject *
strict_utf8(const uint8_t *data, Py_ssize_t start, Py_ssize_t stop, int *step)
{
    PyObject *text = PyUnicode_DecodeUTF8((const char *)data + start, stop - start, NULL);
    if (text == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            *step = STEP_BAIL;
        }
        else {
            *step = STEP_ERROR;
        }
    }
    return text;
}

#endif
