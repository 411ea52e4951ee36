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
 * aside; fsdpdoctor/trace/columns.py turns what it returns into the loader's column tuple.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MAX_DEPTH 64

typedef const unsigned char *ptr;

enum { T_NONE = 0, T_STR, T_INT, T_FLOAT, T_TRUE, T_FALSE, T_NULL, T_OBJ, T_ARR };
enum { F_PH = 0, F_NAME, F_CAT, F_TS, F_DUR, F_PID, F_TID, F_ARGS, N_FIELDS };

typedef struct {
    int type;
    ptr p;            /* a string's bytes between its quotes; a number's text */
    Py_ssize_t n;
    int plain;        /* a string without escapes: its bytes are its UTF-8 text */
} Value;

typedef struct {
    Value v[N_FIELDS];
    unsigned seen;
    ptr args_lo, args_hi;   /* the args object, braces included, when it is one */
    int64_t corr;           /* args' "correlation" as the loader reads it (-1: none) */
    int coll;               /* args has a "Collective name" that is not null */
} Event;

/* ------------------------------------------------------------------ JSON, strictly */

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* Eight bytes at a time where it pays (a trace is ~40 % indentation, names run to hundreds of bytes):
 * the lowest flagged byte of these masks is exact, as no borrow reaches it from below. */
static inline uint64_t load8(ptr p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

static inline __attribute__((always_inline)) ptr skip_ws(ptr p, ptr end) {
    for (;;) {
        if (p < end && *p > ' ') return p;   /* most tokens follow no whitespace at all */
        if (end - p >= 8) {
            uint64_t d = load8(p) ^ (ONES * ' ');
            if (!d) { p += 8; continue; }
            p += __builtin_ctzll(d) >> 3;
            if (*p > ' ') return p;
        }
        if (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) { p++; continue; }
        return p;
    }
}

/* the bytes of x that are a quote, a backslash, a control character or not ASCII (high bit of each) */
static inline uint64_t special8(uint64_t x) {
    uint64_t q = x ^ (ONES * '"'), b = x ^ (ONES * '\\');
    return (((q - ONES) & ~q) | ((b - ONES) & ~b) | ((x - ONES * 0x20) & ~x) | x) & HIGHS;
}

/* the length of the valid UTF-8 sequence at p (a byte >= 0x80), 0 when it is not one */
static int utf8_len(ptr p, ptr end) {
    unsigned c = p[0];
    if (c >= 0xC2 && c <= 0xDF)
        return (end - p >= 2 && (p[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (end - p < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && p[1] < 0xA0) || (c == 0xED && p[1] >= 0xA0)) return 0;  /* overlong, surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (end - p < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80) return 0;
        if ((c == 0xF0 && p[1] < 0x90) || (c == 0xF4 && p[1] >= 0x90)) return 0;
        return 4;
    }
    return 0;
}

static inline int hexval(unsigned c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* p just after an opening quote: just after the closing one, or NULL */
static inline __attribute__((always_inline)) ptr scan_string(ptr p, ptr end, int *plain) {
    *plain = 1;
    for (;;) {
        if (end - p >= 8) {
            uint64_t m = special8(load8(p));
            if (!m) { p += 8; continue; }
            p += __builtin_ctzll(m) >> 3;
        }
        else if (p >= end)
            return NULL;
        unsigned c = *p;
        if (c == '"') return p + 1;
        if (c == '\\') {
            *plain = 0;
            if (end - p < 2) return NULL;
            unsigned e = p[1];
            if (e == 'u') {
                if (end - p < 6) return NULL;
                unsigned v = 0;
                for (int i = 2; i < 6; i++) {
                    int h = hexval(p[i]);
                    if (h < 0) return NULL;
                    v = v * 16 + (unsigned)h;
                }
                if (v >= 0xD800 && v <= 0xDFFF) return NULL;  /* surrogates: left to msgspec */
                p += 6;
            }
            else if (e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't')
                p += 2;
            else
                return NULL;
            continue;
        }
        if (c < 0x20) return NULL;
        if (c >= 0x80) {
            int k = utf8_len(p, end);
            if (!k) return NULL;
            p += k;
            continue;
        }
        p++;
    }
}

static inline int is_digit(unsigned c) { return c >= '0' && c <= '9'; }

/* a number by JSON's grammar: just after it, or NULL */
static ptr scan_number(ptr p, ptr end, int *is_float) {
    *is_float = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') { while (p < end && is_digit(*p)) p++; }
    else return NULL;
    if (p < end && *p == '.') {
        *is_float = 1;
        p++;
        ptr d = p;
        while (p < end && is_digit(*p)) p++;
        if (p == d) return NULL;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        *is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        ptr d = p;
        while (p < end && is_digit(*p)) p++;
        if (p == d) return NULL;
    }
    return p;
}

static ptr skip_value(ptr p, ptr end, int depth);

static ptr literal(ptr p, ptr end, const char *word, Py_ssize_t n) {
    return (end - p >= n && memcmp(p, word, (size_t)n) == 0) ? p + n : NULL;
}

static ptr skip_object(ptr p, ptr end, int depth) {
    int plain;
    if (depth > MAX_DEPTH) return NULL;
    p = skip_ws(p, end);
    if (p < end && *p == '}') return p + 1;
    for (;;) {
        if (p >= end || *p != '"') return NULL;
        p = scan_string(p + 1, end, &plain);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return NULL;
        p = skip_value(skip_ws(p + 1, end), end, depth);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == ',') { p = skip_ws(p + 1, end); continue; }
        return *p == '}' ? p + 1 : NULL;
    }
}

static ptr skip_array(ptr p, ptr end, int depth) {
    if (depth > MAX_DEPTH) return NULL;
    p = skip_ws(p, end);
    if (p < end && *p == ']') return p + 1;
    for (;;) {
        p = skip_value(p, end, depth);
        if (!p) return NULL;
        p = skip_ws(p, end);
        if (p >= end) return NULL;
        if (*p == ',') { p = skip_ws(p + 1, end); continue; }
        return *p == ']' ? p + 1 : NULL;
    }
}

/* one value, its kind and text kept in v */
static ptr read_value(ptr p, ptr end, Value *v, int depth) {
    if (p >= end) return NULL;
    switch (*p) {
    case '"': {
        ptr q = scan_string(p + 1, end, &v->plain);
        if (!q) return NULL;
        v->type = T_STR; v->p = p + 1; v->n = (q - 1) - (p + 1);
        return q;
    }
    case '{': v->type = T_OBJ; return skip_object(p + 1, end, depth + 1);
    case '[': v->type = T_ARR; return skip_array(p + 1, end, depth + 1);
    case 't': v->type = T_TRUE; return literal(p, end, "true", 4);
    case 'f': v->type = T_FALSE; return literal(p, end, "false", 5);
    case 'n': v->type = T_NULL; return literal(p, end, "null", 4);
    default: {
        int is_float;
        ptr q = scan_number(p, end, &is_float);
        if (!q) return NULL;
        v->type = is_float ? T_FLOAT : T_INT; v->p = p; v->n = q - p;
        return q;
    }
    }
}

static ptr skip_value(ptr p, ptr end, int depth) {
    Value v;
    return read_value(p, end, &v, depth);
}

/* ------------------------------------------------------------------ numbers as the Python reading has them */

/* an integer's text as int64; 0 when it does not fit (msgspec would give a Python int past int64) */
static int int64_of(const Value *v, int64_t *out) {
    ptr p = v->p, end = v->p + v->n;
    int neg = 0;
    uint64_t m = 0;
    if (*p == '-') { neg = 1; p++; }
    if (end - p > 19) return 0;
    for (; p < end; p++) m = m * 10 + (uint64_t)(*p - '0');
    if (neg) {
        if (m > (uint64_t)INT64_MAX + 1) return 0;
        *out = (int64_t)(0 - m);
    }
    else {
        if (m > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)m;
    }
    return 1;
}

static const double POW10[23] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13,
                                 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* a number's text as the double msgspec gives (both are correctly rounded: the same bits); 0 when it is
 * not finite or cannot be read */
static int double_of(const Value *v, double *out) {
    if (v->type == T_INT) {
        int64_t i;
        if (!int64_of(v, &i)) return 0;
        *out = (double)i;  /* as Python converts an int: rounded to nearest */
        return 1;
    }
    ptr p = v->p, end = v->p + v->n;
    int neg = 0, digits = 0;
    uint64_t m = 0;
    int64_t exp10 = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; p < end && is_digit(*p); p++) {
        m = m * 10 + (uint64_t)(*p - '0');
        if (m) digits++;
    }
    if (p < end && *p == '.') {
        for (p++; p < end && is_digit(*p); p++) {
            m = m * 10 + (uint64_t)(*p - '0');
            if (m) digits++;
            exp10--;
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int esign = 1;
        int64_t e = 0;
        p++;
        if (*p == '+') p++;
        else if (*p == '-') { esign = -1; p++; }
        for (; p < end; p++) if (e < 100000) e = e * 10 + (*p - '0');
        exp10 += esign * e;
    }
    double val;
    if (digits <= 19 && (m >> 53) == 0 && exp10 >= -22 && exp10 <= 22) {
        /* the fast path msgspec takes too: both operands exact, one rounding */
        val = (double)m;
        val = exp10 >= 0 ? val * POW10[exp10] : val / POW10[-exp10];
        if (neg) val = -val;
    }
    else {
        char buf[72];
        if (v->n >= (Py_ssize_t)sizeof(buf)) return 0;
        memcpy(buf, v->p, (size_t)v->n);
        buf[v->n] = 0;
        char *stop;
        val = PyOS_string_to_double(buf, &stop, NULL);
        if (val == -1.0 && PyErr_Occurred()) { PyErr_Clear(); return 0; }
        if (*stop) return 0;
    }
    if (!isfinite(val)) return 0;
    *out = val;
    return 1;
}

/* args' "correlation" as loader._corr_value reads it: an int, a float truncated, anything else -1;
 * 0 when the Python reading would refuse it (past int64) */
static int corr_of(const Value *v, int64_t *out) {
    if (v->type == T_INT) return int64_of(v, out);
    if (v->type == T_FLOAT) {
        double d;
        if (!double_of(v, &d) || d >= 9223372036854775808.0 || d <= -9223372036854775808.0) return 0;
        *out = (int64_t)d;
        return 1;
    }
    *out = -1;
    return 1;
}

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

static PyObject *scan(PyObject *self, PyObject *arg) {
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
                out = Py_BuildValue("(OOOOOOOOOOOOO)", s.name_list, cols[C_NID], s.cat_list, cols[C_CAT],
                                    s.track_list, cols[C_TRK], cols[C_TS], cols[C_DUR], cols[C_ALO],
                                    cols[C_AHI], cols[C_CORR], cols[C_COLL], s.others);
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
     "scan(buffer) -> (names, name ids, categories, category ids, tracks, track ids, ts, dur, args starts, "
     "args ends, correlation ids, collective flags, other events' spans), or None when the Python reading "
     "must read these events."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
