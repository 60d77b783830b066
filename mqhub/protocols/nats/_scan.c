/* The NATS frame scanner's inner loop in C (see scan.py): one receiver's stretch of PUB frames.
 *
 * scan_run(buf, pos, table, max_payload) -> (out, used, frames, payload_bytes)
 *
 * From offset ``pos`` of ``buf`` (a frame boundary), takes consecutive frames
 *
 *     <head> SP <size> CR LF <size bytes> CR LF
 *
 * whose <size> is a canonical decimal (no sign, no leading zero but "0") of at most
 * ``max_payload`` and whose <head> (the control line up to its last space) is a key of
 * ``table`` (bytes -> bytes: head -> the receiver's "MSG subject sid [reply] " head).
 * ``out`` is, for every frame taken, table[head] followed by "<size> CR LF <payload> CR LF":
 * the MSG frames that receiver gets, in one bytes object. ``used`` is the bytes of ``buf``
 * the frames took, ``payload_bytes`` the sum of their sizes. It stops before the first frame
 * that is incomplete, malformed or whose head is not in ``table``; the caller's per-line paths
 * take it from there, so no input is ever judged here alone.
 *
 * The Python fallback (a regular-expression split, scan.py) gives the receiver the same bytes
 * (it frames payloads up to 4 KiB itself and leaves larger ones to the per-line loop); this
 * loop saves its per-frame objects and the join of them: one bytes object per stretch and
 * one small key per frame. Pure function: it reads ``buf`` and ``table`` and writes only the
 * new ``out``. Built by setup.py as an optional extension: without a C compiler mqhub runs
 * the fallback.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef struct {
    PyObject *msg;          /* a strong reference to table[head] */
    Py_ssize_t tail;        /* offset of "<size> CR LF <payload> CR LF" in buf */
    Py_ssize_t tail_len;
} Entry;

/* The canonical decimal in buf[start:end], or -1 (empty, too long, not digits, a leading
 * zero, or more than limit). */
static Py_ssize_t
parse_size(const char *buf, Py_ssize_t start, Py_ssize_t end, Py_ssize_t limit)
{
    Py_ssize_t len = end - start, value = 0, k;
    if (len < 1 || len > 18 || (len > 1 && buf[start] == '0')) {
        return -1;
    }
    for (k = start; k < end; k++) {
        char c = buf[k];
        if (c < '0' || c > '9') {
            return -1;
        }
        value = value * 10 + (c - '0');
    }
    return value <= limit ? value : -1;
}

static void
release_entries(Entry *entries, Py_ssize_t count)
{
    Py_ssize_t k;
    for (k = 0; k < count; k++) {
        Py_DECREF(entries[k].msg);
    }
    PyMem_Free(entries);
}

static PyObject *
scan_run(PyObject *module, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t pos, max_payload;
    PyObject *table;
    Entry *entries = NULL;
    Py_ssize_t count = 0, capacity = 0, out_len = 0, payload = 0;
    PyObject *out = NULL, *result = NULL;

    (void)module;
    if (!PyArg_ParseTuple(args, "y*nO!n:scan_run", &view, &pos, &PyDict_Type, &table,
                          &max_payload)) {
        return NULL;
    }
    const char *buf = (const char *)view.buf;
    const Py_ssize_t n = view.len;
    if (pos < 0 || pos > n) {
        PyErr_SetString(PyExc_ValueError, "scan_run: pos outside the buffer");
        goto done;
    }
    Py_ssize_t p = pos;
    while (p < n) {
        const char *lf = memchr(buf + p, '\n', (size_t)(n - p));
        if (lf == NULL) {
            break;
        }
        Py_ssize_t cr = (lf - buf) - 1;         /* the control line's CR */
        if (cr <= p || buf[cr] != '\r') {
            break;
        }
        Py_ssize_t sp = cr - 1;                 /* its last space */
        while (sp > p && buf[sp] != ' ') {
            sp--;
        }
        if (sp <= p) {
            break;
        }
        Py_ssize_t size = parse_size(buf, sp + 1, cr, max_payload);
        if (size < 0) {
            break;
        }
        Py_ssize_t start = cr + 2;              /* the payload */
        if (size > n - start - 2 || buf[start + size] != '\r' || buf[start + size + 1] != '\n') {
            break;                              /* incomplete, or not followed by CR LF */
        }
        PyObject *key = PyBytes_FromStringAndSize(buf + p, sp - p);
        if (key == NULL) {
            goto done;
        }
        PyObject *msg = PyDict_GetItemWithError(table, key);
        Py_XINCREF(msg);
        Py_DECREF(key);
        if (msg == NULL) {
            if (PyErr_Occurred()) {
                goto done;
            }
            break;
        }
        if (!PyBytes_Check(msg)) {
            Py_DECREF(msg);
            break;
        }
        if (count == capacity) {
            Py_ssize_t more = capacity ? 2 * capacity : 64;
            Entry *grown = PyMem_Realloc(entries, (size_t)more * sizeof(Entry));
            if (grown == NULL) {
                Py_DECREF(msg);
                PyErr_NoMemory();
                goto done;
            }
            entries = grown;
            capacity = more;
        }
        Py_ssize_t tail_len = start + size + 2 - (sp + 1);
        entries[count].msg = msg;
        entries[count].tail = sp + 1;
        entries[count].tail_len = tail_len;
        count++;
        out_len += PyBytes_GET_SIZE(msg) + tail_len;
        payload += size;
        p = start + size + 2;
    }
    out = PyBytes_FromStringAndSize(NULL, out_len);
    if (out == NULL) {
        goto done;
    }
    char *w = PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < count; k++) {
        Py_ssize_t m = PyBytes_GET_SIZE(entries[k].msg);
        memcpy(w, PyBytes_AS_STRING(entries[k].msg), (size_t)m);
        w += m;
        memcpy(w, buf + entries[k].tail, (size_t)entries[k].tail_len);
        w += entries[k].tail_len;
    }
    result = Py_BuildValue("(Nnnn)", out, p - pos, count, payload);
    out = NULL;     /* the tuple owns it (or Py_BuildValue released it) */
done:
    Py_XDECREF(out);
    release_entries(entries, count);
    PyBuffer_Release(&view);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_run", scan_run, METH_VARARGS,
     "scan_run(buf, pos, table, max_payload) -> (out, used, frames, payload_bytes): one "
     "receiver's stretch of PUB frames as its MSG frames (see mqhub/protocols/nats/_scan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_scan",
    "The NATS frame scanner's inner loop in C (optional; scan.py falls back to re.split).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModule_Create(&module);
}
