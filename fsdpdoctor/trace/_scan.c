/* A run of Kineto trace events ("{...},{...}") read straight from its JSON bytes into columns.
 *
 * The Python reading decodes every event into an object (msgspec) and then walks the objects to build
 * columns: two passes of per-event work, the second in the interpreter. This scanner does both in one
 * pass over the bytes and makes no object per event: a name, a category or a track becomes a Python
 * object once, the first time its bytes are seen (a hash table keyed by the bytes themselves).
 *
 * It reads only what it is sure to read exactly as the Python reading would, and is at least as strict
 * as msgspec about JSON: anything else (an escaped name, a key written twice, a phase it does not know,
 * a time that is text, invalid UTF-8, nesting past MAX_DEPTH...) returns None and the caller decodes the
 * piece the ordinary way. So the two readings give the same columns, bit for bit, or this one stands
 * aside; fsdpdoctor/trace/columns.py turns what it returns (a named tuple, Scanned: _scan.pyi) into the
 * loader's columns.
 */
#include "_json_strict.h"

enum { F_PH = 0, F_NAME, F_CAT, F_TS, F_DUR, F_PID, F_TID, F_ARGS, N_FIELDS };

typedef struct {
    Value v[N_FIELDS];
    unsigned seen;
    ptr args_lo, args_hi;   /* the args object, braces included, when it is one */
    int64_t corr;           /* args' "correlation" as the loader reads it (-1: none) */
    int coll;               /* args has a "Collective name" that is not null */
} Event;

/* ------------------------------------------------------------------ an event */

static int field_of(ptr k, Py_ssize_t n) {
    switch (n) {
    case 2:
        if (k[0] == 'p' && k[1] == 'h') return F_PH;
        if (k[0] == 't' && k[1] == 's') return F_TS;
        return -1;
    case 3:
        if (!memcmp(k, "cat", 3)) return F_CAT;
        if (!memcmp(k, "dur", 3)) return F_DUR;
        if (!memcmp(k, "pid", 3)) return F_PID;
        if (!memcmp(k, "tid", 3)) return F_TID;
        return -1;
    case 4:
        if (!memcmp(k, "name", 4)) return F_NAME;
        if (!memcmp(k, "args", 4)) return F_ARGS;
        return -1;
    }
    return -1;
}

/* p at a member of an object: its key in key/kn, and where its value starts; NULL on anything odd */
static ptr next_key(ptr p, ptr end, ptr *key, Py_ssize_t *kn) {
    int plain;
    p = skip_ws(p, end);
    if (p >= end) return NULL;
    if (*p != '"') return NULL;
    *key = p + 1;
    p = scan_string(p + 1, end, &plain);
    if (!p || !plain) return NULL;   /* an escaped key may spell a field: left to msgspec */
    *kn = (p - 1) - *key;
    p = skip_ws(p, end);
    if (p >= end || *p != ':') return NULL;
    return skip_ws(p + 1, end);
}

/* after a member's value: just after the "," (more to come) or the "}" (*closed = 1) */
static ptr after_member(ptr p, ptr end, int *closed) {
    p = skip_ws(p, end);
    if (p >= end) return NULL;
    if (*p == ',') return p + 1;
    if (*p == '}') { *closed = 1; return p + 1; }
    return NULL;
}

static ptr parse_args(ptr p, ptr end, Event *ev) {
    int seen_corr = 0, seen_coll = 0, closed = 0;
    ev->corr = -1;
    ev->coll = 0;
    p = skip_ws(p, end);
    if (p < end && *p == '}') return p + 1;
    while (!closed) {
        ptr k;
        Py_ssize_t kn;
        p = next_key(p, end, &k, &kn);
        if (!p) return NULL;
        if (kn == 11 && !memcmp(k, "correlation", 11)) {
            Value v;
            if (seen_corr++) return NULL;
            p = read_value(p, end, &v, 2);
            if (!p || !corr_of(&v, &ev->corr)) return NULL;
        }
        else if (kn == 15 && !memcmp(k, "Collective name", 15)) {
            Value v;
            if (seen_coll++) return NULL;
            p = read_value(p, end, &v, 2);
            if (!p) return NULL;
            ev->coll = v.type != T_NULL;
        }
        else {
            p = skip_value(p, end, 2);
            if (!p) return NULL;
        }
        p = after_member(p, end, &closed);
        if (!p) return NULL;
    }
    return p;
}

/* p just after an event's "{": just after its "}", its fields in ev */
static ptr parse_event(ptr p, ptr end, Event *ev) {
    int closed = 0;
    p = skip_ws(p, end);
    if (p < end && *p == '}') return p + 1;
    while (!closed) {
        ptr k;
        Py_ssize_t kn;
        p = next_key(p, end, &k, &kn);
        if (!p) return NULL;
        int f = field_of(k, kn);
        if (f < 0) {
            p = skip_value(p, end, 1);
        }
        else {
            if (ev->seen & (1u << f)) return NULL;   /* a field written twice */
            ev->seen |= 1u << f;
            if (f == F_ARGS && p < end && *p == '{') {
                ev->v[F_ARGS].type = T_OBJ;
                ev->args_lo = p;
                p = parse_args(p + 1, end, ev);
                ev->args_hi = p;
            }
            else {
                p = read_value(p, end, &ev->v[f], 1);
            }
        }
        if (!p) return NULL;
        p = after_member(p, end, &closed);
        if (!p) return NULL;
    }
    return p;
}

/* ------------------------------------------------------------------ tables of names, categories, tracks */

enum { K_NONE = 0, K_INT, K_STR };

typedef struct {
    uint64_t h;
    ptr p1, p2;
    Py_ssize_t n1, n2;
    int k1, k2;
    int32_t id;
} Entry;

typedef struct {
    Entry *slots;
    size_t cap, count;
} Table;

static uint64_t hash_bytes(uint64_t h, ptr p, Py_ssize_t n) {
    h ^= (uint64_t)n * 0x9E3779B97F4A7C15ULL;
    while (n >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        h = (h ^ x) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t x = 0;
    if (n > 0) memcpy(&x, p, (size_t)n);
    h = (h ^ x) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 32);
}

/* slots hold id + 1: a zeroed slot is empty */
static int table_grow(Table *t) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    Entry *slots = calloc(cap, sizeof(Entry));
    if (!slots) return -1;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].id) continue;
        size_t j = t->slots[i].h & (cap - 1);
        while (slots[j].id) j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* the id of the key (k1, p1[:n1]) + (k2, p2[:n2]); a new key gets the next id (*fresh = 1) */
static int table_id(Table *t, uint64_t seed, int k1, ptr p1, Py_ssize_t n1, int k2, ptr p2, Py_ssize_t n2,
                    int32_t *id, int *fresh) {
    uint64_t h = hash_bytes(hash_bytes(seed ^ (uint64_t)(k1 * 3 + k2), p1, n1), p2, n2);
    if ((t->count + 1) * 2 > t->cap && table_grow(t) < 0) return -1;
    size_t j = h & (t->cap - 1);
    for (;;) {
        Entry *e = &t->slots[j];
        if (!e->id) {
            e->h = h; e->k1 = k1; e->p1 = p1; e->n1 = n1; e->k2 = k2; e->p2 = p2; e->n2 = n2;
            e->id = (int32_t)++t->count;
            *id = e->id - 1;
            *fresh = 1;
            return 0;
        }
        if (e->h == h && e->k1 == k1 && e->k2 == k2 && e->n1 == n1 && e->n2 == n2 &&
            (n1 == 0 || !memcmp(e->p1, p1, (size_t)n1)) && (n2 == 0 || !memcmp(e->p2, p2, (size_t)n2))) {
            *id = e->id - 1;
            *fresh = 0;
            return 0;
        }
        j = (j + 1) & (t->cap - 1);
    }
}

/* ------------------------------------------------------------------ columns */

typedef struct {
    char *data;
    size_t len, cap;
} Vec;

static inline int vec_push(Vec *v, const void *x, size_t size) {
    if (v->len + size > v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 4096;
        while (cap < v->len + size) cap *= 2;
        char *d = realloc(v->data, cap);
        if (!d) return -1;
        v->data = d;
        v->cap = cap;
    }
    memcpy(v->data + v->len, x, size);
    v->len += size;
    return 0;
}

enum { C_NID = 0, C_CAT, C_TRK, C_TS, C_DUR, C_ALO, C_AHI, C_CORR, C_COLL, N_COLS };

typedef struct {
    ptr base;
    uint64_t seed;
    Table names, cats, tracks;
    PyObject *name_list, *cat_list, *track_list, *others;
    Vec cols[N_COLS];
} State;

/* a pid or tid: its kind, and its text as the key (an int's digits, a string's bytes) */
static int track_part(const Value *v, int *kind, int64_t *num) {
    switch (v->type) {
    case T_NONE: case T_NULL: *kind = K_NONE; return 1;
    case T_INT:
        if (v->n == 2 && v->p[0] == '-' && v->p[1] == '0') return 0;   /* -0 is 0: two texts, one value */
        *kind = K_INT;
        return int64_of(v, num);
    case T_STR: *kind = K_STR; return v->plain;
    }
    return 0;
}

static PyObject *track_object(const Value *v, int kind, int64_t num) {
    if (kind == K_NONE) Py_RETURN_NONE;
    if (kind == K_INT) return PyLong_FromLongLong(num);
    return PyUnicode_DecodeUTF8((const char *)v->p, v->n, NULL);
}

/* 1 taken, 0 left to the Python reading, -1 a Python error */
static int take_complete(State *s, Event *ev) {
    Value *name = &ev->v[F_NAME], *cat = &ev->v[F_CAT], *pid = &ev->v[F_PID], *tid = &ev->v[F_TID];
    double ts, dur = 0.0;
    if (name->type == T_NONE) { name->type = T_STR; name->p = (ptr)""; name->n = 0; name->plain = 1; }
    if (name->type != T_STR || !name->plain) return 0;
    if (cat->type != T_NONE && cat->type != T_NULL && !(cat->type == T_STR && cat->plain)) return 0;
    if ((ev->v[F_TS].type != T_INT && ev->v[F_TS].type != T_FLOAT) || !double_of(&ev->v[F_TS], &ts)) return 0;
    int dt = ev->v[F_DUR].type;
    if (dt != T_NONE && dt != T_NULL && ((dt != T_INT && dt != T_FLOAT) || !double_of(&ev->v[F_DUR], &dur))) return 0;
    int kp, kt;
    int64_t np_ = 0, nt = 0;
    if (!track_part(pid, &kp, &np_) || !track_part(tid, &kt, &nt)) return 0;
    if (ev->v[F_ARGS].type != T_NONE && ev->v[F_ARGS].type != T_OBJ) return 0;

    int32_t nid, cid, trk;
    int fresh;
    if (table_id(&s->names, s->seed, K_STR, name->p, name->n, 0, NULL, 0, &nid, &fresh) < 0) goto nomem;
    if (fresh) {
        PyObject *o = PyUnicode_DecodeUTF8((const char *)name->p, name->n, NULL);
        if (!o || PyList_Append(s->name_list, o) < 0) { Py_XDECREF(o); return -1; }
        Py_DECREF(o);
    }
    int kc = cat->type == T_STR ? K_STR : K_NONE;
    if (table_id(&s->cats, s->seed, kc, kc ? cat->p : NULL, kc ? cat->n : 0, 0, NULL, 0, &cid, &fresh) < 0)
        goto nomem;
    if (fresh) {
        PyObject *o = kc ? PyUnicode_DecodeUTF8((const char *)cat->p, cat->n, NULL) : (Py_INCREF(Py_None), Py_None);
        if (!o || PyList_Append(s->cat_list, o) < 0) { Py_XDECREF(o); return -1; }
        Py_DECREF(o);
    }
    if (table_id(&s->tracks, s->seed, kp, kp ? pid->p : NULL, kp ? pid->n : 0, kt, kt ? tid->p : NULL,
                 kt ? tid->n : 0, &trk, &fresh) < 0)
        goto nomem;
    if (fresh) {
        PyObject *a = track_object(pid, kp, np_), *b = a ? track_object(tid, kt, nt) : NULL;
        PyObject *key = b ? PyTuple_Pack(2, a, b) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
        if (!key || PyList_Append(s->track_list, key) < 0) { Py_XDECREF(key); return -1; }
        Py_DECREF(key);
    }
    int64_t lo = 0, hi = 0, corr = -1;
    uint8_t coll = 0;
    if (ev->v[F_ARGS].type == T_OBJ) {
        lo = ev->args_lo - s->base;
        hi = ev->args_hi - s->base;
        corr = ev->corr;
        coll = (uint8_t)ev->coll;
    }
    if (vec_push(&s->cols[C_NID], &nid, 4) || vec_push(&s->cols[C_CAT], &cid, 4) ||
        vec_push(&s->cols[C_TRK], &trk, 4) || vec_push(&s->cols[C_TS], &ts, 8) ||
        vec_push(&s->cols[C_DUR], &dur, 8) || vec_push(&s->cols[C_ALO], &lo, 8) ||
        vec_push(&s->cols[C_AHI], &hi, 8) || vec_push(&s->cols[C_CORR], &corr, 8) ||
        vec_push(&s->cols[C_COLL], &coll, 1))
        goto nomem;
    return 1;
nomem:
    PyErr_NoMemory();
    return -1;
}

/* 1 taken, 0 left to the Python reading, -1 a Python error */
static int take_event(State *s, Event *ev, ptr lo, ptr hi) {
    Value *ph = &ev->v[F_PH];
    if (ph->type != T_STR || !ph->plain || ph->n != 1) return 0;
    switch (ph->p[0]) {
    case 'X':
        return take_complete(s, ev);
    case 'M': case 'i': case 'I': {   /* metadata and instants: few, decoded by msgspec from their bytes */
        PyObject *span = Py_BuildValue("(nn)", (Py_ssize_t)(lo - s->base), (Py_ssize_t)(hi - s->base));
        if (!span || PyList_Append(s->others, span) < 0) { Py_XDECREF(span); return -1; }
        Py_DECREF(span);
        return 1;
    }
    /* the phases the loader never reads (events.py's _SKIPPED_PHASES) */
    case 's': case 'f': case 't': case 'C': case 'B': case 'E': case 'b': case 'e': case 'n': case 'P':
    case 'O': case 'N': case 'D': case 'R': case 'S': case 'T': case 'p': case 'F':
        return 1;
    }
    return 0;
}

/* 1 read, 0 left to the Python reading, -1 a Python error */
static int scan_events(State *s, ptr p, ptr end) {
    p = skip_ws(p, end);
    if (p >= end) return 0;
    for (;;) {
        if (*p != '{') return 0;
        ptr lo = p;
        Event ev;
        memset(&ev, 0, sizeof(ev));
        p = parse_event(p + 1, end, &ev);
        if (!p) return 0;
        int r = take_event(s, &ev, lo, p);
        if (r <= 0) return r;
        p = skip_ws(p, end);
        if (p >= end) return 1;
        if (*p != ',') return 0;
        p = skip_ws(p + 1, end);
        if (p >= end) return 0;
    }
}

/* ------------------------------------------------------------------ the result: a named tuple (_scan.pyi) */

static PyStructSequence_Field scanned_fields[] = {
    {"names", "the names, each once, in order of first appearance"},
    {"name_ids", "int32 per complete event: its name's index in names"},
    {"categories", "the categories as written (a str or None), each once"},
    {"category_ids", "int32 per complete event: its category's index in categories"},
    {"tracks", "(pid, tid) of each track, each once"},
    {"track_ids", "int32 per complete event: its track's index in tracks"},
    {"ts", "float64 per complete event: its start (us)"},
    {"dur", "float64 per complete event: its duration (us), 0.0 without one"},
    {"args_starts", "int64 per complete event: where its args object starts in the buffer (0: none)"},
    {"args_ends", "int64 per complete event: just after its args object (0: none)"},
    {"correlations", "int64 per complete event: args' correlation id (-1: none)"},
    {"collective", "uint8 per complete event: 1 when args has a Collective name that is not null"},
    {"others", "(start, end) of each metadata or instant event in the buffer"},
    {NULL, NULL}};

static PyStructSequence_Desc scanned_desc = {
    "fsdpdoctor.trace._scan.Scanned",
    "The columns of a run of trace events read by scan(); the per-event columns are bytearrays of "
    "native-endian numbers, one per complete (\"X\") event.",
    scanned_fields, 13};

static PyTypeObject *Scanned;

static PyObject *scanned_of(State *s, PyObject **cols) {
    PyObject *out = PyStructSequence_New(Scanned);
    if (!out) return NULL;
    PyObject *items[13] = {s->name_list, cols[C_NID], s->cat_list, cols[C_CAT], s->track_list, cols[C_TRK],
                           cols[C_TS], cols[C_DUR], cols[C_ALO], cols[C_AHI], cols[C_CORR], cols[C_COLL],
                           s->others};
    for (int i = 0; i < 13; i++) {
        Py_INCREF(items[i]);
        PyStructSequence_SetItem(out, i, items[i]);
    }
    return out;
}

static PyObject *scan(PyObject *self, PyObject *arg) {
    (void)self;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    State s;
    memset(&s, 0, sizeof(s));
    s.base = (ptr)view.buf;
    /* room for an event per 128 bytes (traces hold one per 200-500): the columns seldom grow */
    static const size_t width[N_COLS] = {4, 4, 4, 8, 8, 8, 8, 8, 1};
    for (int i = 0; i < N_COLS; i++) {
        s.cols[i].data = malloc(((size_t)view.len / 128 + 64) * width[i]);
        s.cols[i].cap = s.cols[i].data ? ((size_t)view.len / 128 + 64) * width[i] : 0;
    }
    s.seed = (uint64_t)(uintptr_t)&s * 0x9E3779B97F4A7C15ULL;   /* differs run to run: no crafted collisions */
    PyObject *out = NULL;
    s.name_list = PyList_New(0);
    s.cat_list = PyList_New(0);
    s.track_list = PyList_New(0);
    s.others = PyList_New(0);
    if (s.name_list && s.cat_list && s.track_list && s.others) {
        int r = scan_events(&s, s.base, s.base + view.len);
        if (r > 0) {
            PyObject *cols[N_COLS] = {NULL};
            int ok = 1;
            for (int i = 0; i < N_COLS; i++) {
                cols[i] = PyByteArray_FromStringAndSize(s.cols[i].data ? s.cols[i].data : "", (Py_ssize_t)s.cols[i].len);
                if (!cols[i]) ok = 0;
            }
            if (ok)
                out = scanned_of(&s, cols);
            for (int i = 0; i < N_COLS; i++) Py_XDECREF(cols[i]);
        }
        else if (r == 0) {
            out = Py_None;
            Py_INCREF(out);
        }
    }
    Py_XDECREF(s.name_list);
    Py_XDECREF(s.cat_list);
    Py_XDECREF(s.track_list);
    Py_XDECREF(s.others);
    free(s.names.slots);
    free(s.cats.slots);
    free(s.tracks.slots);
    for (int i = 0; i < N_COLS; i++) free(s.cols[i].data);
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_O,
     "scan(buffer) -> Scanned | None: the columns of a run of trace events (\"{...},{...}\"), or None when "
     "the Python reading must read these events."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__scan(void) {
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    if (!Scanned) {
        Scanned = PyStructSequence_NewType(&scanned_desc);
        if (!Scanned) { Py_DECREF(m); return NULL; }
    }
    Py_INCREF(Scanned);
    if (PyModule_AddObject(m, "Scanned", (PyObject *)Scanned) < 0) {
        Py_DECREF(Scanned);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
