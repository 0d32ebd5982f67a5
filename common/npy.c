/*
 * npy.c: .npy read and write (format versions 1.0 and 2.0), float16 and float32 only,
 * little-endian, C order. Enough to exchange Q, K, V, O and LSE with numpy and PyTorch.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

size_t npy_count(const npy_array *a) {
    size_t n = 1;
    for (int i = 0; i < a->ndim; i++) n *= (size_t)a->shape[i];
    return n;
}

/* Finds `'key':` in the header dict and returns a pointer just past the colon and spaces. */
static const char *dict_value(const char *hdr, const char *key) {
    char pat[32];
    snprintf(pat, sizeof pat, "'%s'", key);
    const char *p = strstr(hdr, pat);
    if (!p) return NULL;
    p = strchr(p + strlen(pat), ':');
    if (!p) return NULL;
    p++;
    while (*p == ' ') p++;
    return p;
}

/* The header dictionary after the magic string and version: malloc'd text, or NULL with a reason
 * in err. */
static char *read_header(FILE *f, const char *path, char *err, size_t errlen) {
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        snprintf(err, errlen, "'%s' is not a .npy file", path);
        return NULL;
    }
    size_t hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    if (pre[6] == 2 || pre[6] == 3) { /* versions 2 and 3: a 4-byte header length */
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2) {
            snprintf(err, errlen, "'%s': truncated header", path);
            return NULL;
        }
        hlen |= ((size_t)b[0] << 16) | ((size_t)b[1] << 24);
    } else if (pre[6] != 1) {
        snprintf(err, errlen, "'%s': unsupported .npy version %d", path, pre[6]);
        return NULL;
    }
    char *hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        snprintf(err, errlen, "'%s': truncated header", path);
        free(hdr);
        return NULL;
    }
    hdr[hlen] = 0;
    return hdr;
}

/* The dtype from the header's 'descr' value d: float16 or float32 only. 0, or -1 with a reason. */
static int parse_dtype(const char *d, const char *path, npy_array *out, char *err, size_t errlen) {
    if (strncmp(d, "'<f2'", 5) == 0) {
        out->dtype = NPY_F16;
        return 0;
    }
    if (strncmp(d, "'<f4'", 5) == 0) {
        out->dtype = NPY_F32;
        return 0;
    }
    if (*d != '\'') {
        snprintf(err, errlen,
                 "'%s': a structured dtype (%.20s...) is not supported (float16 "
                 "'<f2' or float32 '<f4')",
                 path, d);
        return -1;
    }
    const char *e = strchr(d + 1, '\'');
    int len = e ? (int)(e - d - 1) : 8;
    snprintf(err, errlen, "'%s': dtype %.*s not supported (float16 '<f2' or float32 '<f4')", path,
             len, d + 1);
    return -1;
}

/* The shape from the header's 'shape' value sh ("(2, 3, 4)"), and its size in bytes (*overflow
 * when that does not fit a size_t). 0, or -1 with a reason. */
static int parse_shape(const char *sh, const char *path, npy_array *out, size_t *bytes,
                       int *overflow, char *err, size_t errlen) {
    const char *p = sh + 1;
    out->ndim = 0;
    *bytes = (size_t)out->dtype;
    *overflow = 0;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') return 0;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || errno || out->ndim == 8) {
            snprintf(err, errlen, "'%s': malformed shape", path);
            return -1;
        }
        if (v > 0 && *bytes > SIZE_MAX / (unsigned long long)v)
            *overflow = 1;
        else
            *bytes *= (size_t)v;
        out->shape[out->ndim++] = v;
        p = end;
    }
}

/* The data: bytes of them, after the header. The shape must fit in memory and in the file before
 * anything is allocated for it. 0, -1 or NPY_ERR_NOMEM with a reason. */
static int read_data(FILE *f, const char *path, size_t bytes, int overflow, npy_array *out,
                     char *err, size_t errlen) {
    long here = ftell(f);
    long long avail = -1;
    if (here >= 0 && fseek(f, 0, SEEK_END) == 0) {
        avail = (long long)ftell(f) - here;
        if (fseek(f, here, SEEK_SET) != 0) avail = -1;
    }
    if (overflow) {
        snprintf(err, errlen, "'%s': shape too large (its size overflows)", path);
        return -1;
    }
    if (avail >= 0 && (unsigned long long)avail < (unsigned long long)bytes) {
        snprintf(err, errlen,
                 "'%s': file shorter than its shape says (%lld bytes of data, the "
                 "shape needs %zu)",
                 path, avail, bytes);
        return -1;
    }
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        snprintf(err, errlen, "'%s' needs %zu bytes", path, bytes);
        return NPY_ERR_NOMEM;
    }
    if (fread(out->data, 1, bytes, f) != bytes) {
        snprintf(err, errlen, "'%s': file shorter than its shape says", path);
        free(out->data);
        out->data = NULL;
        return -1;
    }
    return 0;
}

/* The header's values in their checking order, then the data. */
static int read_body(FILE *f, const char *hdr, const char *path, npy_array *out, char *err,
                     size_t errlen) {
    const char *d = dict_value(hdr, "descr");
    const char *fo = dict_value(hdr, "fortran_order");
    const char *sh = dict_value(hdr, "shape");
    if (!d || !fo || !sh || *sh != '(') {
        snprintf(err, errlen, "'%s': malformed header", path);
        return -1;
    }
    if (parse_dtype(d, path, out, err, errlen) != 0) return -1;
    if (strncmp(fo, "False", 5) != 0) {
        snprintf(err, errlen, "'%s': Fortran order not supported (save a C-contiguous array)",
                 path);
        return -1;
    }
    size_t bytes;
    int overflow;
    if (parse_shape(sh, path, out, &bytes, &overflow, err, errlen) != 0) return -1;
    return read_data(f, path, bytes, overflow, out, err, errlen);
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    char *hdr = read_header(f, path, err, errlen);
    int rc = hdr ? read_body(f, hdr, path, out, err, errlen) : -1;
    free(hdr);
    fclose(f);
    return rc;
}

int npy_write(const char *path, npy_dtype dtype, int ndim, const long long *shape, const void *data,
              char *err, size_t errlen) {
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (",
                       dtype == NPY_F16 ? "<f2" : "<f4");
    size_t n = 1;
    for (int i = 0; i < ndim; i++) {
        len += snprintf(dict + len, sizeof dict - (size_t)len, "%lld%s", shape[i],
                        ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
        n *= (size_t)shape[i];
    }
    len += snprintf(dict + len, sizeof dict - (size_t)len, "), }");
    /* magic(6) + version(2) + hlen(2) + dict + spaces + '\n', padded to a multiple of 64 */
    size_t total = 10 + (size_t)len + 1;
    size_t pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)len + pad + 1;
    FILE *f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10] = {0x93,
                             'N',
                             'U',
                             'M',
                             'P',
                             'Y',
                             1,
                             0,
                             (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};
    int ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)len, f) == (size_t)len;
    for (size_t i = 0; ok && i < pad; i++) ok = fputc(' ', f) != EOF;
    ok = ok && fputc('\n', f) != EOF;
    ok = ok && fwrite(data, (size_t)dtype, n, f) == n;
    if (fclose(f) != 0) ok = 0;
    if (!ok) {
        snprintf(err, errlen, "cannot write '%s': %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
