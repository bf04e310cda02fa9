/*
 * The codec's hot loops in C: Avro binary bodies of sluicegate's records, the Java
 * client's murmur2 partitioner, and execution ids (version-5 UUIDs placed on a partition).
 *
 * A Program is compiled (by sluicegate/schemas/codec.py) from a record's schema into a
 * tree of nodes; encode() and decode() walk it. They take exactly the cases the Python
 * fast path takes and produce exactly its bytes and records; anything else (a value of
 * an unexpected type, bytes that do not decode) raises NotFast, and the codec redoes the
 * work through fastavro, so every error stays what it was (tests/unit/test_codec_fast.py
 * checks all three paths against one another).
 *
 * Node specs, as built by codec.py:
 *   ("long",) ("string",) ("bytes",) ("double",) ("boolean",)
 *   ("optional", spec)                      the union ["null", T]
 *   ("enum", {symbol: index}, [members])
 *   ("array", spec)   ("map", spec)         map keys are strings
 *   ("record", cls, (field name, ...), (spec, ...))
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

static PyObject *NotFast;

enum kind { K_LONG, K_STRING, K_BYTES, K_DOUBLE, K_BOOLEAN, K_OPTIONAL, K_ENUM, K_ARRAY,
            K_MAP, K_RECORD };

typedef struct node {
    enum kind kind;
    struct node *inner;      /* optional, array, map: the item type */
    PyObject *cls;           /* record: the class to build; */
    Py_ssize_t nfields;
    PyObject **names;        /* record: interned field names */
    Py_ssize_t *offsets;     /* record: each field's slot, when `slotted` */
    int slotted;             /* record: built and read through its slots directly */
    struct node **fields;    /* record: field types */
    PyObject *symbols;       /* enum: dict symbol -> index */
    PyObject *members;       /* enum: list index -> member */
} node;

static void node_free(node *n) {
    if (n == NULL)
        return;
    node_free(n->inner);
    Py_XDECREF(n->cls);
    Py_XDECREF(n->symbols);
    Py_XDECREF(n->members);
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        if (n->names)
            Py_XDECREF(n->names[i]);
        if (n->fields)
            node_free(n->fields[i]);
    }
    PyMem_Free(n->names);
    PyMem_Free(n->fields);
    PyMem_Free(n->offsets);
    PyMem_Free(n);
}

static node *node_compile(PyObject *spec);

static node *node_new(enum kind kind) {
    node *n = PyMem_Calloc(1, sizeof(node));
    if (n == NULL)
        PyErr_NoMemory();
    else
        n->kind = kind;
    return n;
}

/* The slot offsets of `names` in `type`, into `*out` (PyMem, the caller's to free), when
 * each is a plain writable object slot, as in a slots dataclass: 1; 0 when the class is
 * not such a class (nothing allocated); -1 with an exception set. */
static int slot_offsets(PyTypeObject *type, PyObject **names, Py_ssize_t n,
                        Py_ssize_t **out) {
    Py_ssize_t *offsets = PyMem_Calloc(n ? n : 1, sizeof(Py_ssize_t));
    if (offsets == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *descr = PyDict_GetItemWithError(type->tp_dict, names[i]);
        if (descr == NULL || Py_TYPE(descr) != &PyMemberDescr_Type) {
            PyMem_Free(offsets);
            return PyErr_Occurred() ? -1 : 0;
        }
        PyMemberDef *member = ((PyMemberDescrObject *)descr)->d_member;
        if (member->type != T_OBJECT_EX || (member->flags & READONLY)) {
            PyMem_Free(offsets);
            return 0;
        }
        offsets[i] = member->offset;
    }
    *out = offsets;
    return 1;
}

/* A record class whose fields are all plain object slots (a slots dataclass) and which has
 * no __post_init__ is built by filling its slots, and read from them: what its generated
 * __init__ and attribute access do, without running Python code. Any other class is
 * called and read through getattr. */
static int find_slots(node *r) {
    if (!PyType_Check(r->cls))
        return 0;
    PyTypeObject *type = (PyTypeObject *)r->cls;
    int has_post_init = PyObject_HasAttrString(r->cls, "__post_init__");
    if (has_post_init || type->tp_alloc == NULL)
        return 0;
    int found = slot_offsets(type, r->names, r->nfields, &r->offsets);
    if (found == 1)
        r->slotted = 1;
    return found < 0 ? -1 : 0;
}

static node *compile_record(PyObject *spec) {
    PyObject *cls, *names, *specs;
    if (!PyArg_ParseTuple(spec, "sOO!O!", &(const char *){NULL}, &cls, &PyTuple_Type, &names,
                          &PyTuple_Type, &specs))
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    if (PyTuple_GET_SIZE(specs) != n) {
        PyErr_SetString(PyExc_ValueError, "record spec: names and types differ in number");
        return NULL;
    }
    node *r = node_new(K_RECORD);
    if (r == NULL)
        return NULL;
    Py_INCREF(cls);
    r->cls = cls;
    r->names = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    r->fields = PyMem_Calloc(n ? n : 1, sizeof(node *));
    r->nfields = n;
    if (r->names == NULL || r->fields == NULL) {
        node_free(r);
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(names, i);
        if (!PyUnicode_Check(name)) {
            node_free(r);
            PyErr_SetString(PyExc_TypeError, "record spec: a field name is not a str");
            return NULL;
        }
        Py_INCREF(name);
        PyUnicode_InternInPlace(&name);
        r->names[i] = name;
        r->fields[i] = node_compile(PyTuple_GET_ITEM(specs, i));
        if (r->fields[i] == NULL) {
            node_free(r);
            return NULL;
        }
    }
    if (find_slots(r) < 0) {
        node_free(r);
        return NULL;
    }
    return r;
}

static node *node_compile(PyObject *spec) {
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) < 1 ||
        !PyUnicode_Check(PyTuple_GET_ITEM(spec, 0))) {
        PyErr_SetString(PyExc_TypeError, "a node spec is a tuple starting with its kind");
        return NULL;
    }
    const char *kind = PyUnicode_AsUTF8(PyTuple_GET_ITEM(spec, 0));
    if (kind == NULL)
        return NULL;
    static const struct { const char *name; enum kind kind; } plain[] = {
        {"long", K_LONG}, {"string", K_STRING}, {"bytes", K_BYTES}, {"double", K_DOUBLE},
        {"boolean", K_BOOLEAN},
    };
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (strcmp(kind, plain[i].name) == 0)
            return node_new(plain[i].kind);
    if (strcmp(kind, "optional") == 0 || strcmp(kind, "array") == 0 ||
        strcmp(kind, "map") == 0) {
        if (PyTuple_GET_SIZE(spec) != 2) {
            PyErr_Format(PyExc_ValueError, "%s spec: (kind, item spec)", kind);
            return NULL;
        }
        node *n = node_new(kind[0] == 'o' ? K_OPTIONAL : kind[0] == 'a' ? K_ARRAY : K_MAP);
        if (n == NULL)
            return NULL;
        n->inner = node_compile(PyTuple_GET_ITEM(spec, 1));
        if (n->inner == NULL) {
            node_free(n);
            return NULL;
        }
        return n;
    }
    if (strcmp(kind, "enum") == 0) {
        PyObject *symbols, *members;
        if (!PyArg_ParseTuple(spec, "sO!O!", &(const char *){NULL}, &PyDict_Type, &symbols,
                              &PyList_Type, &members))
            return NULL;
        node *n = node_new(K_ENUM);
        if (n == NULL)
            return NULL;
        Py_INCREF(symbols);
        Py_INCREF(members);
        n->symbols = symbols;
        n->members = members;
        return n;
    }
    if (strcmp(kind, "record") == 0)
        return compile_record(spec);
    PyErr_Format(PyExc_ValueError, "unknown node kind %s", kind);
    return NULL;
}

/* -- encoding ------------------------------------------------------------------------ */

typedef struct {
    char *data;
    Py_ssize_t len, cap;
    char inline_buf[512];
} buffer;

static int buf_reserve(buffer *b, Py_ssize_t more) {
    if (b->len + more <= b->cap)
        return 0;
    Py_ssize_t cap = b->cap * 2;
    while (cap < b->len + more)
        cap *= 2;
    char *data;
    if (b->data == b->inline_buf) {
        data = PyMem_Malloc(cap);
        if (data != NULL)
            memcpy(data, b->data, b->len);
    } else {
        data = PyMem_Realloc(b->data, cap);
    }
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->cap = cap;
    return 0;
}

static int put_raw(buffer *b, const char *src, Py_ssize_t n) {
    if (buf_reserve(b, n) < 0)
        return -1;
    memcpy(b->data + b->len, src, n);
    b->len += n;
    return 0;
}

static int put_byte(buffer *b, char c) {
    if (buf_reserve(b, 1) < 0)
        return -1;
    b->data[b->len++] = c;
    return 0;
}

/* Avro's zig-zag varint of a long. */
static int put_long(buffer *b, int64_t n) {
    uint64_t z = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    if (buf_reserve(b, 10) < 0)
        return -1;
    while (z >= 0x80) {
        b->data[b->len++] = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    b->data[b->len++] = (char)z;
    return 0;
}

static int not_fast(const char *why) {
    PyErr_SetString(NotFast, why);
    return -1;
}

static int put_text(buffer *b, PyObject *v) {
    if (!PyUnicode_CheckExact(v))
        return not_fast("not a str");
    Py_ssize_t n;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &n);
    if (utf8 == NULL) {  /* lone surrogates: fastavro says what it says */
        PyErr_Clear();
        return not_fast("not UTF-8 encodable");
    }
    if (put_long(b, n) < 0)
        return -1;
    return put_raw(b, utf8, n);
}

static int encode_node(node *n, PyObject *v, buffer *b);

static int encode_record(node *n, PyObject *v, buffer *b) {
    if ((PyObject *)Py_TYPE(v) != n->cls)
        return not_fast("not the record's class");
    if (n->slotted) {
        for (Py_ssize_t i = 0; i < n->nfields; i++) {
            PyObject *f = *(PyObject **)((char *)v + n->offsets[i]);
            if (f == NULL)
                return not_fast("a field is missing");
            Py_INCREF(f);  /* the walk may run Python code (a dict's keys' __eq__) */
            int rc = encode_node(n->fields[i], f, b);
            Py_DECREF(f);
            if (rc < 0)
                return -1;
        }
        return 0;
    }
    for (Py_ssize_t i = 0; i < n->nfields; i++) {
        PyObject *f = PyObject_GetAttr(v, n->names[i]);
        if (f == NULL) {
            PyErr_Clear();
            return not_fast("a field is missing");
        }
        int rc = encode_node(n->fields[i], f, b);
        Py_DECREF(f);
        if (rc < 0)
            return -1;
    }
    return 0;
}

static int encode_node(node *n, PyObject *v, buffer *b) {
    switch (n->kind) {
    case K_LONG: {
        if (!PyLong_CheckExact(v))
            return not_fast("not an int");
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (overflow)
            return not_fast("outside a long's range");
        return put_long(b, x);
    }
    case K_STRING:
        return put_text(b, v);
    case K_BYTES: {
        if (!PyBytes_CheckExact(v))
            return not_fast("not bytes");
        Py_ssize_t len = PyBytes_GET_SIZE(v);
        if (put_long(b, len) < 0)
            return -1;
        return put_raw(b, PyBytes_AS_STRING(v), len);
    }
    case K_DOUBLE: {
        if (!PyFloat_CheckExact(v))
            return not_fast("not a float");
        if (buf_reserve(b, 8) < 0)
            return -1;
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(v), b->data + b->len, 1) < 0)
            return -1;
        b->len += 8;
        return 0;
    }
    case K_BOOLEAN:
        if (v == Py_True)
            return put_byte(b, 1);
        if (v == Py_False)
            return put_byte(b, 0);
        return not_fast("not a bool");
    case K_OPTIONAL:
        if (v == Py_None)
            return put_byte(b, 0);
        if (put_byte(b, 2) < 0)
            return -1;
        return encode_node(n->inner, v, b);
    case K_ENUM: {
        if (!PyUnicode_Check(v))
            return not_fast("not an enum symbol");
        /* A member is found by identity: hashing one runs Enum.__hash__, Python code. */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(n->members); i++)
            if (PyList_GET_ITEM(n->members, i) == v)
                return put_long(b, i);
        PyObject *index = PyDict_GetItemWithError(n->symbols, v);
        if (index == NULL) {
            PyErr_Clear();
            return not_fast("not one of the enum's symbols");
        }
        return put_long(b, PyLong_AsLongLong(index));
    }
    case K_ARRAY: {
        if (!PyList_CheckExact(v))
            return not_fast("not a list");
        Py_ssize_t count = PyList_GET_SIZE(v);
        if (count) {
            if (put_long(b, count) < 0)
                return -1;
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(v); i++) {
                PyObject *item = PyList_GET_ITEM(v, i);
                Py_INCREF(item);
                int rc = encode_node(n->inner, item, b);
                Py_DECREF(item);
                if (rc < 0)
                    return -1;
            }
            if (PyList_GET_SIZE(v) != count)
                return not_fast("the list changed while it was written");
        }
        return put_byte(b, 0);
    }
    case K_MAP: {
        if (!PyDict_CheckExact(v))
            return not_fast("not a dict");
        Py_ssize_t count = PyDict_GET_SIZE(v);
        if (count) {
            if (put_long(b, count) < 0)
                return -1;
            Py_ssize_t pos = 0;
            PyObject *key, *value;
            while (PyDict_Next(v, &pos, &key, &value)) {
                Py_INCREF(key);
                Py_INCREF(value);
                int rc = put_text(b, key);
                if (rc == 0)
                    rc = encode_node(n->inner, value, b);
                Py_DECREF(key);
                Py_DECREF(value);
                if (rc < 0)
                    return -1;
            }
            if (PyDict_GET_SIZE(v) != count)
                return not_fast("the dict changed while it was written");
        }
        return put_byte(b, 0);
    }
    case K_RECORD:
        return encode_record(n, v, b);
    }
    return not_fast("unknown node");
}

/* -- decoding ------------------------------------------------------------------------ */

typedef struct {
    const unsigned char *data;
    Py_ssize_t pos, len;
} reader;

static int get_long(reader *r, int64_t *out) {
    uint64_t z = 0;
    int shift = 0;
    for (;;) {
        if (r->pos >= r->len)
            return not_fast("the bytes end inside a varint");
        unsigned char c = r->data[r->pos++];
        if (shift == 63 && (c & 0x7E))
            return not_fast("a varint longer than 64 bits");
        z |= (uint64_t)(c & 0x7F) << shift;
        if (c < 0x80)
            break;
        shift += 7;
        if (shift > 63)
            return not_fast("a varint longer than 10 bytes");
    }
    *out = (int64_t)(z >> 1) ^ -(int64_t)(z & 1);
    return 0;
}

static int get_length(reader *r, Py_ssize_t *n) {
    int64_t x;
    if (get_long(r, &x) < 0)
        return -1;
    if (x < 0 || x > r->len - r->pos)
        return not_fast("a length beyond the bytes");
    *n = (Py_ssize_t)x;
    return 0;
}

static PyObject *get_text(reader *r) {
    Py_ssize_t n;
    if (get_length(r, &n) < 0)
        return NULL;
    PyObject *s = PyUnicode_DecodeUTF8((const char *)r->data + r->pos, n, NULL);
    if (s == NULL) {
        PyErr_Clear();
        not_fast("a string that is not UTF-8");
        return NULL;
    }
    r->pos += n;
    return s;
}

static PyObject *decode_node(node *n, reader *r);

static PyObject *decode_block_count(reader *r, int64_t *count) {
    if (get_long(r, count) < 0)
        return NULL;
    if (*count < 0) {
        not_fast("a block with a byte size");
        return NULL;
    }
    return Py_None;  /* borrowed: only a success marker */
}

static PyObject *decode_node(node *n, reader *r) {
    switch (n->kind) {
    case K_LONG: {
        int64_t x;
        if (get_long(r, &x) < 0)
            return NULL;
        return PyLong_FromLongLong(x);
    }
    case K_STRING:
        return get_text(r);
    case K_BYTES: {
        Py_ssize_t len;
        if (get_length(r, &len) < 0)
            return NULL;
        PyObject *v = PyBytes_FromStringAndSize((const char *)r->data + r->pos, len);
        r->pos += len;
        return v;
    }
    case K_DOUBLE: {
        if (r->len - r->pos < 8) {
            not_fast("the bytes end inside a double");
            return NULL;
        }
        double d = PyFloat_Unpack8((const char *)r->data + r->pos, 1);
        if (d == -1.0 && PyErr_Occurred())
            return NULL;
        r->pos += 8;
        return PyFloat_FromDouble(d);
    }
    case K_BOOLEAN: {
        if (r->pos >= r->len) {
            not_fast("the bytes end before a boolean");
            return NULL;
        }
        unsigned char c = r->data[r->pos++];
        if (c > 1) {
            not_fast("a boolean byte other than 0 or 1");
            return NULL;
        }
        return Py_NewRef(c ? Py_True : Py_False);
    }
    case K_OPTIONAL: {
        if (r->pos >= r->len) {
            not_fast("the bytes end before a union branch");
            return NULL;
        }
        unsigned char c = r->data[r->pos];
        if (c == 0) {
            r->pos++;
            return Py_NewRef(Py_None);
        }
        if (c != 2) {
            not_fast("a union branch other than null or the type");
            return NULL;
        }
        r->pos++;
        return decode_node(n->inner, r);
    }
    case K_ENUM: {
        int64_t k;
        if (get_long(r, &k) < 0)
            return NULL;
        if (k < 0 || k >= PyList_GET_SIZE(n->members)) {
            not_fast("an enum index out of range");
            return NULL;
        }
        return Py_NewRef(PyList_GET_ITEM(n->members, k));
    }
    case K_ARRAY: {
        PyObject *list = PyList_New(0);
        if (list == NULL)
            return NULL;
        for (;;) {
            int64_t count;
            if (decode_block_count(r, &count) == NULL)
                goto array_fail;
            if (count == 0)
                return list;
            for (int64_t i = 0; i < count; i++) {
                PyObject *item = decode_node(n->inner, r);
                if (item == NULL)
                    goto array_fail;
                int rc = PyList_Append(list, item);
                Py_DECREF(item);
                if (rc < 0)
                    goto array_fail;
            }
        }
    array_fail:
        Py_DECREF(list);
        return NULL;
    }
    case K_MAP: {
        PyObject *dict = PyDict_New();
        if (dict == NULL)
            return NULL;
        for (;;) {
            int64_t count;
            if (decode_block_count(r, &count) == NULL)
                goto map_fail;
            if (count == 0)
                return dict;
            for (int64_t i = 0; i < count; i++) {
                PyObject *key = get_text(r);
                if (key == NULL)
                    goto map_fail;
                PyObject *value = decode_node(n->inner, r);
                if (value == NULL) {
                    Py_DECREF(key);
                    goto map_fail;
                }
                int rc = PyDict_SetItem(dict, key, value);
                Py_DECREF(key);
                Py_DECREF(value);
                if (rc < 0)
                    goto map_fail;
            }
        }
    map_fail:
        Py_DECREF(dict);
        return NULL;
    }
    case K_RECORD: {
        PyObject *small[16];
        PyObject **args = n->nfields <= 16 ? small : PyMem_Malloc(n->nfields * sizeof(PyObject *));
        if (args == NULL)
            return PyErr_NoMemory();
        Py_ssize_t done = 0;
        PyObject *out = NULL;
        for (; done < n->nfields; done++) {
            args[done] = decode_node(n->fields[done], r);
            if (args[done] == NULL)
                goto record_done;
        }
        if (n->slotted) {
            PyTypeObject *type = (PyTypeObject *)n->cls;
            out = type->tp_alloc(type, 0);
            if (out != NULL) {
                for (Py_ssize_t i = 0; i < n->nfields; i++) {
                    *(PyObject **)((char *)out + n->offsets[i]) = args[i];  /* steals */
                }
                done = 0;  /* the record owns the values now */
            }
        } else {
            /* The class's own __init__, as the Python decoder calls it. */
            out = PyObject_Vectorcall(n->cls, args, n->nfields, NULL);
        }
    record_done:
        for (Py_ssize_t i = 0; i < done; i++)
            Py_DECREF(args[i]);
        if (args != small)
            PyMem_Free(args);
        return out;
    }
    }
    not_fast("unknown node");
    return NULL;
}

/* -- the Program type ---------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    node *root;
    PyObject *header;  /* bytes written before every body */
} Program;

static void Program_dealloc(Program *self) {
    node_free(self->root);
    Py_XDECREF(self->header);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Program_init(Program *self, PyObject *args, PyObject *kwds) {
    PyObject *spec, *header;
    if (!PyArg_ParseTuple(args, "OS:Program", &spec, &header))
        return -1;
    node *root = node_compile(spec);
    if (root == NULL)
        return -1;
    node_free(self->root);
    self->root = root;
    Py_INCREF(header);
    Py_XSETREF(self->header, header);
    return 0;
}

PyDoc_STRVAR(encode_doc,
"encode(record) -> bytes\n\n"
"The program's header followed by the record's Avro body; NotFast if the record is not "
"a plain case.");

static PyObject *Program_encode(Program *self, PyObject *record) {
    if (self->root == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the program was not initialised");
        return NULL;
    }
    buffer b;
    b.data = b.inline_buf;
    b.len = 0;
    b.cap = sizeof b.inline_buf;
    PyObject *out = NULL;
    if (put_raw(&b, PyBytes_AS_STRING(self->header), PyBytes_GET_SIZE(self->header)) == 0 &&
        encode_node(self->root, record, &b) == 0)
        out = PyBytes_FromStringAndSize(b.data, b.len);
    if (b.data != b.inline_buf)
        PyMem_Free(b.data);
    return out;
}

PyDoc_STRVAR(decode_doc,
"decode(data: bytes, pos: int) -> record\n\n"
"The record whose Avro body starts at `pos` and ends exactly at the end of `data`; "
"NotFast otherwise.");

static PyObject *Program_decode(Program *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "decode(data: bytes, pos: int)");
        return NULL;
    }
    if (self->root == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the program was not initialised");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    reader r = {(const unsigned char *)PyBytes_AS_STRING(args[0]), pos,
                PyBytes_GET_SIZE(args[0])};
    if (pos < 0 || pos > r.len) {
        not_fast("the body starts outside the bytes");
        return NULL;
    }
    PyObject *out = decode_node(self->root, &r);
    if (out != NULL && r.pos != r.len) {
        Py_DECREF(out);
        not_fast("bytes left after the record");
        return NULL;
    }
    return out;
}

static PyMethodDef Program_methods[] = {
    {"encode", (PyCFunction)Program_encode, METH_O, encode_doc},
    {"decode", (PyCFunction)(void (*)(void))Program_decode, METH_FASTCALL, decode_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluicegate.schemas._speedups.Program",
    .tp_doc = PyDoc_STR("Program(spec, header): one record type's encoder and decoder."),
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_methods = Program_methods,
};

/* -- murmur2 ------------------------------------------------------------------------- */

#define MURMUR2_M 0x5bd1e995u

/* One 4-byte block (little-endian) into the running hash. */
static inline uint32_t murmur2_block(uint32_t h, const unsigned char *block) {
    uint32_t k = (uint32_t)block[0] | (uint32_t)block[1] << 8 | (uint32_t)block[2] << 16 |
                 (uint32_t)block[3] << 24;
    k *= MURMUR2_M;
    k ^= k >> 24;
    k *= MURMUR2_M;
    return (h * MURMUR2_M) ^ k;
}

static inline uint32_t murmur2_final(uint32_t h) {
    h ^= h >> 13;
    h *= MURMUR2_M;
    h ^= h >> 15;
    return h;
}

/* The Java default partitioner's step from a key's murmur2 to its partition. */
static inline uint32_t partition_of_hash(uint32_t h, uint32_t partitions) {
    return (h & 0x7fffffffu) % partitions;
}

static int32_t murmur2_of(const unsigned char *data, Py_ssize_t length) {
    uint32_t h = 0x9747b28cu ^ (uint32_t)length;
    Py_ssize_t whole = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < whole; i += 4)
        h = murmur2_block(h, data + i);
    switch (length & 3) {
    case 3: h ^= (uint32_t)data[whole + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[whole + 1] << 8;  /* fall through */
    case 1: h ^= (uint32_t)data[whole]; h *= MURMUR2_M;
    }
    return (int32_t)murmur2_final(h);
}

static PyObject *speedups_murmur2(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int32_t h = murmur2_of(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong(h);
}

static PyObject *speedups_partition_for(PyObject *module, PyObject *const *args,
                                        Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "partition_for(key, partitions)");
        return NULL;
    }
    long partitions = PyLong_AsLong(args[1]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    if (partitions < 1)
        return PyErr_Format(PyExc_ValueError,
                            "a topic has at least 1 partition, got %ld", partitions);
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t h = (uint32_t)murmur2_of(view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)partition_of_hash(h, (uint32_t)partitions));
}

/* -- name-based UUIDs ------------------------------------------------------------------ */

static const char HEX_DIGITS[] = "0123456789abcdef";

/* The text of a version-5 UUID from the SHA-1 digest of its namespace and name (RFC 4122
 * section 4.3): the first 16 bytes, version 5 in the high nibble of byte 6, the variant
 * in the two high bits of byte 8, as lowercase hex in 8-4-4-4-12 groups. */
static PyObject *speedups_uuid5_text(PyObject *module, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    if (view.len != 20) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "a SHA-1 digest has 20 bytes, got %zd",
                            view.len);
    }
    unsigned char b[16];
    memcpy(b, view.buf, 16);
    PyBuffer_Release(&view);
    b[6] = (unsigned char)((b[6] & 0x0F) | 0x50);
    b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
    PyObject *text = PyUnicode_New(36, 127);
    if (text == NULL)
        return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(text);
    for (int i = 0, j = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10)
            out[j++] = '-';
        out[j++] = (Py_UCS1)HEX_DIGITS[b[i] >> 4];
        out[j++] = (Py_UCS1)HEX_DIGITS[b[i] & 0x0F];
    }
    return text;
}

/* The same UUID placed on a partition (docs/decisions/placed-execution-ids.md): its last
 * 16 bits (the last four hex digits) counted up from their own value, modulo 2^16, to the
 * first value whose text the Java default partitioner puts on `partition` of
 * `partitions`. None when no value does (only possible with very many partitions). Only
 * the last 4-byte block of the 36-byte text changes, so murmur2's state after the first
 * eight blocks is computed once. */
static PyObject *speedups_placed_uuid_text(PyObject *module, PyObject *const *args,
                                           Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "placed_uuid_text(text, partitions, partition)");
        return NULL;
    }
    long partitions = PyLong_AsLong(args[1]);
    if (partitions == -1 && PyErr_Occurred())
        return NULL;
    long partition = PyLong_AsLong(args[2]);
    if (partition == -1 && PyErr_Occurred())
        return NULL;
    if (partitions < 1 || partition < 0 || partition >= partitions)
        return PyErr_Format(PyExc_ValueError, "partition %ld of %ld partitions", partition,
                            partitions);
    if (!PyUnicode_Check(args[0]) || PyUnicode_KIND(args[0]) != PyUnicode_1BYTE_KIND ||
        PyUnicode_GET_LENGTH(args[0]) != 36)
        return PyErr_Format(PyExc_ValueError, "a UUID's text has 36 ASCII characters");
    unsigned char text[36];
    memcpy(text, PyUnicode_1BYTE_DATA(args[0]), 36);
    unsigned int start = 0;
    for (int i = 32; i < 36; i++) {
        unsigned char c = text[i];
        unsigned int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                         : 16;
        if (v == 16)
            return PyErr_Format(PyExc_ValueError, "a UUID's text is lowercase hex");
        start = start << 4 | v;
    }
    uint32_t prefix = 0x9747b28cu ^ 36u;
    for (int i = 0; i < 32; i += 4)
        prefix = murmur2_block(prefix, text + i);
    for (unsigned int n = 0; n < 0x10000u; n++) {
        unsigned int v = (start + n) & 0xFFFFu;
        unsigned char last[4];
        for (int i = 0; i < 4; i++)
            last[i] = (unsigned char)HEX_DIGITS[(v >> (12 - 4 * i)) & 15];
        uint32_t h = murmur2_final(murmur2_block(prefix, last));
        if ((long)partition_of_hash(h, (uint32_t)partitions) == partition) {
            memcpy(text + 32, last, 4);
            return PyUnicode_FromStringAndSize((const char *)text, 36);
        }
    }
    Py_RETURN_NONE;
}

static PyMethodDef speedups_methods[] = {
    {"uuid5_text", speedups_uuid5_text, METH_O,
     PyDoc_STR("uuid5_text(sha1_digest) -> str: the version-5 UUID that digest makes, as text.")},
    {"placed_uuid_text", (PyCFunction)(void (*)(void))speedups_placed_uuid_text,
     METH_FASTCALL,
     PyDoc_STR("placed_uuid_text(text, partitions, partition) -> str | None: the UUID with "
               "its last 16 bits moved to the first value on that partition.")},
    {"murmur2", speedups_murmur2, METH_O,
     PyDoc_STR("murmur2(data) -> int: Java's Utils.murmur2, a signed 32-bit int.")},
    {"partition_for", (PyCFunction)(void (*)(void))speedups_partition_for, METH_FASTCALL,
     PyDoc_STR("partition_for(key, partitions) -> int: the Java default partitioner's pick.")},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT, "sluicegate.schemas._speedups",
    PyDoc_STR("The codec's hot loops in C (see _speedups.c)."), -1, speedups_methods,
};

PyMODINIT_FUNC PyInit__speedups(void) {
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    NotFast = PyErr_NewException("sluicegate.schemas._speedups.NotFast", NULL, NULL);
    if (NotFast == NULL || PyModule_AddObjectRef(m, "NotFast", NotFast) < 0 ||
        PyModule_AddObjectRef(m, "Program", (PyObject *)&ProgramType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
