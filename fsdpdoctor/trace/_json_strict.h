/* Strict JSON for the trace scanner (_scan.c): whitespace, strings, numbers and nested values read by
 * JSON's grammar, never past `end`, and numbers read as the Python reading reads them. Everything returns
 * NULL (or 0) on what it does not accept; the scanner then stands aside. Included by _scan.c only. */
#ifndef FSDPDOCTOR_JSON_STRICT_H
#define FSDPDOCTOR_JSON_STRICT_H
/* eight bytes are read as one little-endian word (the first byte lowest) with GCC/Clang builtins:
 * elsewhere the build fails, the extension is optional, and traces are read by msgspec */
#if !defined(__GNUC__) || !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "fsdpdoctor's trace scanner needs GCC or Clang on a little-endian machine"
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define MAX_DEPTH 64

typedef const unsigned char *ptr;

enum { T_NONE = 0, T_STR, T_INT, T_FLOAT, T_TRUE, T_FALSE, T_NULL, T_OBJ, T_ARR };
typedef struct {
    int type;
    ptr p;            /* a string's bytes between its quotes; a number's text */
    Py_ssize_t n;
    int plain;        /* a string without escapes: its bytes are its UTF-8 text */
} Value;

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

/* just after the run of digits at p, eight bytes at a time (a time stamp has 16) */
static inline ptr skip_digits(ptr p, ptr end) {
    const uint64_t high = 0xF0F0F0F0F0F0F0F0ULL, zeros = ONES * '0';
    while (end - p >= 8) {
        uint64_t x = load8(p);
        /* a byte is a digit when its high nibble is 3, before and after adding 6 */
        uint64_t t = ((x & high) ^ zeros) | (((x + ONES * 6) & high) ^ zeros);
        if (t) return p + (__builtin_ctzll(t) >> 3);
        p += 8;
    }
    while (p < end && is_digit(*p)) p++;
    return p;
}

/* a number by JSON's grammar: just after it, or NULL */
static ptr scan_number(ptr p, ptr end, int *is_float) {
    *is_float = 0;
    if (p < end && *p == '-') p++;
    if (p >= end) return NULL;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') p = skip_digits(p + 1, end);
    else return NULL;
    if (p < end && *p == '.') {
        *is_float = 1;
        p++;
        ptr d = p;
        p = skip_digits(p, end);
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
 * not finite or cannot be read here exactly: a mantissa of more than 19 significant digits (it would wrap
 * uint64: 9223372036854775808.0 read as 0) or an exponent too long to hold (it would saturate and come
 * back into the fast path's range) is left to msgspec */
static int double_of(const Value *v, double *out) {
    if (v->type == T_INT) {
        int64_t i;
        if (!int64_of(v, &i)) return 0;
        *out = (double)i;  /* as Python converts an int: rounded to nearest */
        return 1;
    }
    ptr p = v->p, end = v->p + v->n;
    int neg = 0, digits = 0;   /* digits: every one from the first that is not 0 */
    uint64_t m = 0;
    int64_t exp10 = 0;
    if (*p == '-') { neg = 1; p++; }
    for (; p < end && is_digit(*p); p++) {
        if (digits || *p != '0') digits++;
        if (digits > 19) return 0;
        m = m * 10 + (uint64_t)(*p - '0');
    }
    if (p < end && *p == '.') {
        for (p++; p < end && is_digit(*p); p++) {
            if (digits || *p != '0') digits++;
            if (digits > 19) return 0;
            m = m * 10 + (uint64_t)(*p - '0');
            exp10--;   /* at most the 19 digits kept plus the zeros before them: the text is no longer */
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        int esign = 1;
        int64_t e = 0;
        p++;
        if (*p == '+') p++;
        else if (*p == '-') { esign = -1; p++; }
        for (; p < end; p++) {
            e = e * 10 + (*p - '0');
            if (e >= 100000) return 0;   /* saturated: left to msgspec (no trace time is 1e100000) */
        }
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

#endif
