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

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    unsigned char pre[10];
    if (fread(pre, 1, 10, f) != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        snprintf(err, errlen, "'%s' is not a .npy file", path);
        fclose(f);
        return -1;
    }
    size_t hlen;
    if (pre[6] == 1) {
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8);
    } else if (pre[6] == 2 || pre[6] == 3) {
        unsigned char b[2];
        if (fread(b, 1, 2, f) != 2) {
            snprintf(err, errlen, "'%s': truncated header", path);
            fclose(f);
            return -1;
        }
        hlen = (size_t)pre[8] | ((size_t)pre[9] << 8) | ((size_t)b[0] << 16) | ((size_t)b[1] << 24);
    } else {
        snprintf(err, errlen, "'%s': unsupported .npy version %d", path, pre[6]);
        fclose(f);
        return -1;
    }
    char *hdr = malloc(hlen + 1);
    if (!hdr || fread(hdr, 1, hlen, f) != hlen) {
        snprintf(err, errlen, "'%s': truncated header", path);
        free(hdr);
        fclose(f);
        return -1;
    }
    hdr[hlen] = 0;
    int rc = -1;
    const char *d = dict_value(hdr, "descr");
    const char *fo = dict_value(hdr, "fortran_order");
    const char *sh = dict_value(hdr, "shape");
    if (!d || !fo || !sh || *sh != '(') {
        snprintf(err, errlen, "'%s': malformed header", path);
        goto done;
    }
    if (strncmp(d, "'<f2'", 5) == 0) {
        out->dtype = NPY_F16;
    } else if (strncmp(d, "'<f4'", 5) == 0) {
        out->dtype = NPY_F32;
    } else if (*d != '\'') {
        snprintf(err, errlen,
                 "'%s': a structured dtype (%.20s...) is not supported (float16 "
                 "'<f2' or float32 '<f4')",
                 path, d);
        goto done;
    } else {
        const char *e = strchr(d + 1, '\'');
        int len = e ? (int)(e - d - 1) : 8;
        snprintf(err, errlen, "'%s': dtype %.*s not supported (float16 '<f2' or float32 '<f4')",
                 path, len, d + 1);
        goto done;
    }
    if (strncmp(fo, "False", 5) != 0) {
        snprintf(err, errlen, "'%s': Fortran order not supported (save a C-contiguous array)",
                 path);
        goto done;
    }
    const char *p = sh + 1;
    out->ndim = 0;
    size_t bytes = (size_t)out->dtype;
    int overflow = 0;
    for (;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || errno || out->ndim == 8) {
            snprintf(err, errlen, "'%s': malformed shape", path);
            goto done;
        }
        if (v > 0 && bytes > SIZE_MAX / (unsigned long long)v)
            overflow = 1;
        else
            bytes *= (size_t)v;
        out->shape[out->ndim++] = v;
        p = end;
    }
    /* The shape must fit in memory and in the file before anything is allocated for it. */
    long here = ftell(f);
    long long avail = -1;
    if (here >= 0 && fseek(f, 0, SEEK_END) == 0) {
        avail = (long long)ftell(f) - here;
        if (fseek(f, here, SEEK_SET) != 0) avail = -1;
    }
    if (overflow) {
        snprintf(err, errlen, "'%s': shape too large (its size overflows)", path);
        goto done;
    }
    if (avail >= 0 && (unsigned long long)avail < (unsigned long long)bytes) {
        snprintf(err, errlen,
                 "'%s': file shorter than its shape says (%lld bytes of data, the "
                 "shape needs %zu)",
                 path, avail, bytes);
        goto done;
    }
    out->data = malloc(bytes ? bytes : 1);
    if (!out->data) {
        snprintf(err, errlen, "'%s' needs %zu bytes", path, bytes);
        rc = NPY_ERR_NOMEM;
        goto done;
    }
    if (fread(out->data, 1, bytes, f) != bytes) {
        snprintf(err, errlen, "'%s': file shorter than its shape says", path);
        free(out->data);
        out->data = NULL;
        goto done;
    }
    rc = 0;
done:
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
