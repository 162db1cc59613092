/* Stand-in NVML for test hosts: libnvidia-ml.so.1 answering what orchestrator.adapters.nvml asks.
 *
 * The same state as the stand-in nvidia-smi (tests/standin/nvidia_smi.py), read on every call:
 * $STANDIN_GPU_DIR (default /run/standin-gpu)/gpus.json {"count", "memory_mib", "name", "driver"}
 * (missing or unreadable: 8 GPUs of the default), and one <pid>.json per holder {"pid", "name", "gpus",
 * "mib_per_gpu"} whose process is alive (not gone, not a zombie). GPU UUIDs are nvidia_smi.gpu_uuid's:
 * uuid5(NAMESPACE_DNS, "<nodename>.gpu<index>"). "driver": false makes nvmlInit fail the way a box
 * without a loaded driver does (NVML_ERROR_DRIVER_NOT_LOADED; the stand-in nvidia-smi exits 9).
 * STANDIN_NVML_NO_MEMORY_V2 set: nvmlDeviceGetMemoryInfo_v2 is "not found", as on an old driver.
 *
 * Only the symbols nvidia-ml-py (pynvml) resolves for them: nvmlInitWithFlags, nvmlInit_v2,
 * nvmlShutdown, nvmlErrorString, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
 * nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetMemoryInfo(_v2),
 * nvmlDeviceGetComputeRunningProcesses_v3, nvmlSystemGetProcessName. The JSON reader knows only the
 * stand-in's own small files (an object of numbers, strings, booleans and arrays of numbers).
 *
 * Build: gcc -shared -fPIC -O2 -Wl,-soname,libnvidia-ml.so.1 -o DIR/libnvidia-ml.so.1 fake_nvml.c
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0, NVML_ERROR_UNINITIALIZED = 1, NVML_ERROR_INVALID_ARGUMENT = 2, NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7, NVML_ERROR_DRIVER_NOT_LOADED = 9, NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25, NVML_ERROR_UNKNOWN = 999
};
#define MAX_GPUS 64
#define MAX_HOLDERS 256
#define NAME_LEN 96
#define MIB (1ULL << 20)
#define MEMORY_V2 0x02000028u /* pynvml.nvmlMemory_v2: sizeof | 2 << 24 */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
struct nvmlDevice_st { unsigned int index; };
typedef struct nvmlDevice_st *nvmlDevice_t;

static struct nvmlDevice_st devices[MAX_GPUS];
static int initialised;

typedef struct { long long count, memory_mib; int driver; char name[NAME_LEN]; } gpu_spec;
typedef struct { long long pid, mib; int ngpus; int gpus[MAX_GPUS]; char name[NAME_LEN]; } holder;

/* -- the stand-in's JSON ------------------------------------------------------------------------ */

static const char *ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* A string at p ('"'), into out (truncated to n-1 bytes; \uXXXX as UTF-8); the byte after it, or NULL. */
static const char *string(const char *p, char *out, size_t n) {
    size_t k = 0;
    if (*p++ != '"') return NULL;
    for (; *p && *p != '"'; p++) {
        char buf[4];
        size_t len = 1;
        buf[0] = *p;
        if (*p == '\\') {
            p++;
            switch (*p) {
            case 'n': buf[0] = '\n'; break;
            case 't': buf[0] = '\t'; break;
            case 'r': buf[0] = '\r'; break;
            case 'b': buf[0] = '\b'; break;
            case 'f': buf[0] = '\f'; break;
            case 'u': {
                char hex[5] = {0};
                unsigned cp;
                if (strlen(p) < 5) return NULL;
                memcpy(hex, p + 1, 4);
                cp = (unsigned)strtoul(hex, NULL, 16);
                p += 4;
                if (cp < 0x80) buf[0] = (char)cp;
                else if (cp < 0x800) { buf[0] = (char)(0xC0 | cp >> 6); buf[1] = (char)(0x80 | (cp & 0x3F)); len = 2; }
                else {
                    buf[0] = (char)(0xE0 | cp >> 12); buf[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    buf[2] = (char)(0x80 | (cp & 0x3F)); len = 3;
                }
                break;
            }
            case '\0': return NULL;
            default: buf[0] = *p; /* \" \\ \/ */
            }
        }
        for (size_t i = 0; i < len; i++)
            if (k + 1 < n) out[k++] = buf[i];
    }
    if (*p != '"') return NULL;
    if (n) out[k] = '\0';
    return p + 1;
}

static const char *number(const char *p, long long *out) {
    char *end;
    double v = strtod(p, &end);
    if (end == p) return NULL;
    *out = (long long)v; /* Python's int() of the stand-in's numbers */
    return end;
}

/* Past any value (nested arrays and objects included); NULL when malformed. */
static const char *skip(const char *p) {
    int depth = 0;
    char scratch[2];
    do {
        p = ws(p);
        if (*p == '"') { if (!(p = string(p, scratch, sizeof scratch))) return NULL; }
        else if (*p == '[' || *p == '{') { depth++; p++; }
        else if (*p == ']' || *p == '}') { if (--depth < 0) return NULL; p++; }
        else if (*p == ',' || *p == ':') p++;
        else if (*p == '\0') return NULL;
        else { while (*p && !strchr(",]} \t\r\n", *p)) p++; }
    } while (depth > 0);
    return p;
}

/* Calls on_key(key, value, ctx) for each member of the top-level object; on_key returns the byte
 * after the value it read, or NULL to have it skipped. 0 when the text is not such an object. */
typedef const char *(*member_fn)(const char *key, const char *value, void *ctx);
static int members(const char *p, member_fn on_key, void *ctx) {
    char key[32];
    p = ws(p);
    if (*p++ != '{') return 0;
    p = ws(p);
    if (*p == '}') return 1;
    for (;;) {
        const char *q, *value;
        if (!(p = string(ws(p), key, sizeof key))) return 0;
        p = ws(p);
        if (*p++ != ':') return 0;
        value = ws(p);
        q = on_key(key, value, ctx);
        if (!(p = q ? q : skip(value))) return 0;
        p = ws(p);
        if (*p == '}') return 1;
        if (*p++ != ',') return 0;
    }
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    char *buf;
    size_t n;
    if (!f) return NULL;
    buf = malloc(65537);
    n = buf ? fread(buf, 1, 65536, f) : 0;
    fclose(f);
    if (buf) buf[n] = '\0';
    return buf;
}

static const char *gpu_dir(void) {
    const char *d = getenv("STANDIN_GPU_DIR");
    return d && *d ? d : "/run/standin-gpu";
}

static const char *spec_member(const char *key, const char *v, void *ctx) {
    gpu_spec *s = ctx;
    if (!strcmp(key, "count")) return number(v, &s->count);
    if (!strcmp(key, "memory_mib")) return number(v, &s->memory_mib);
    if (!strcmp(key, "name")) return string(v, s->name, sizeof s->name);
    if (!strcmp(key, "driver") && !strncmp(v, "false", 5)) { s->driver = 0; return v + 5; }
    return NULL;
}

static gpu_spec load_spec(void) {
    gpu_spec s = {8, 97887, 1, "NVIDIA RTX PRO 6000 Blackwell Server Edition"}, read = s;
    char path[4096];
    char *text;
    snprintf(path, sizeof path, "%s/gpus.json", gpu_dir());
    text = slurp(path);
    if (text && members(text, spec_member, &read)) s = read; /* else the default, as nvidia_smi.load_gpus */
    free(text);
    if (s.count < 0) s.count = 0;
    if (s.count > MAX_GPUS) s.count = MAX_GPUS;
    return s;
}

typedef struct { holder *h; int seen; } holder_ctx;

static const char *holder_member(const char *key, const char *v, void *ctx) {
    holder_ctx *c = ctx;
    if (!strcmp(key, "pid")) { c->seen |= 1; return number(v, &c->h->pid); }
    if (!strcmp(key, "mib_per_gpu")) { c->seen |= 2; return number(v, &c->h->mib); }
    if (!strcmp(key, "name")) { c->seen |= 4; return string(v, c->h->name, sizeof c->h->name); }
    if (!strcmp(key, "gpus")) {
        const char *p = ws(v);
        if (*p++ != '[') return NULL;
        c->seen |= 8;
        c->h->ngpus = 0;
        for (p = ws(p); *p != ']'; p = ws(p)) {
            long long g;
            if (!(p = number(p, &g))) return NULL;
            if (c->h->ngpus < MAX_GPUS) c->h->gpus[c->h->ngpus++] = (int)g;
            p = ws(p);
            if (*p == ',') p++;
            else if (*p != ']') return NULL;
        }
        return p + 1;
    }
    return NULL;
}

static int alive(long long pid) {
    char path[64], buf[1024];
    FILE *f;
    size_t n;
    char *close;
    snprintf(path, sizeof path, "/proc/%lld/stat", pid);
    if (!(f = fopen(path, "r"))) return 0;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (!(close = strrchr(buf, ')'))) return 0;
    close = (char *)ws(close + 1);
    return *close && *close != 'Z' && *close != 'X';
}

static int by_pid(const void *a, const void *b) {
    const holder *x = a, *y = b;
    if (x->pid != y->pid) return x->pid < y->pid ? -1 : 1;
    return x->mib < y->mib ? -1 : x->mib > y->mib;
}

/* Live holders, by PID (nvidia_smi.load_holders' order within one GPU); their number. */
static int load_holders(holder *out, int max) {
    DIR *dir = opendir(gpu_dir());
    struct dirent *e;
    int n = 0;
    if (!dir) return 0;
    while ((e = readdir(dir)) && n < max) {
        size_t len = strlen(e->d_name);
        char path[4096], *text;
        holder_ctx c = {&out[n], 0};
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") || !strcmp(e->d_name, "gpus.json")) continue;
        snprintf(path, sizeof path, "%s/%s", gpu_dir(), e->d_name);
        memset(&out[n], 0, sizeof out[n]);
        text = slurp(path);
        if (text && members(text, holder_member, &c) && c.seen == 15 && alive(out[n].pid)) n++;
        free(text);
    }
    closedir(dir);
    qsort(out, (size_t)n, sizeof *out, by_pid);
    return n;
}

static int holds(const holder *h, unsigned gpu) {
    for (int i = 0; i < h->ngpus; i++)
        if (h->gpus[i] == (int)gpu) return 1;
    return 0;
}

/* -- uuid5 (SHA-1 of the DNS namespace and the name), as uuid.uuid5 ------------------------------ */

static uint32_t rol(uint32_t x, int n) { return x << n | x >> (32 - n); }

static void sha1(const unsigned char *msg, size_t len, unsigned char out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    unsigned char *m = calloc(total, 1);
    if (!m) { memset(out, 0, 20); return; }
    memcpy(m, msg, len);
    m[len] = 0x80;
    for (int i = 0; i < 8; i++) m[total - 1 - i] = (unsigned char)((unsigned long long)len * 8 >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[80], a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)m[off + 4 * i] << 24 | (uint32_t)m[off + 4 * i + 1] << 16
                   | (uint32_t)m[off + 4 * i + 2] << 8 | m[off + 4 * i + 3];
        for (int i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        for (int i = 0; i < 80; i++) {
            uint32_t f, k, t;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            t = rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    free(m);
    for (int i = 0; i < 20; i++) out[i] = (unsigned char)(h[i / 4] >> (24 - 8 * (i % 4)));
}

static void gpu_uuid(unsigned index, char out[48]) {
    static const unsigned char dns[16] = {0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1,
                                          0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8};
    unsigned char msg[16 + 300], d[20];
    struct utsname u;
    int n;
    if (uname(&u) != 0) strcpy(u.nodename, "localhost");
    memcpy(msg, dns, 16);
    n = snprintf((char *)msg + 16, sizeof msg - 16, "%s.gpu%u", u.nodename, index);
    sha1(msg, 16 + (size_t)n, d);
    d[6] = (unsigned char)((d[6] & 0x0F) | 0x50);
    d[8] = (unsigned char)((d[8] & 0x3F) | 0x80);
    snprintf(out, 48, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]);
}

/* -- the NVML API -------------------------------------------------------------------------------- */

static nvmlReturn_t copy(const char *value, char *out, unsigned length) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(out, value);
    return NVML_SUCCESS;
}

static nvmlReturn_t device_ok(nvmlDevice_t device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || device < devices || device >= devices + MAX_GPUS) return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    if (!load_spec().driver) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned i = 0; i < MAX_GPUS; i++) devices[i].index = i;
    initialised++;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

nvmlReturn_t nvmlShutdown(void) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned)load_spec().count;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= (unsigned)load_spec().count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    char text[48];
    nvmlReturn_t r = device_ok(device);
    if (r) return r;
    gpu_uuid(device->index, text);
    return copy(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t r = device_ok(device);
    if (r) return r;
    return copy(load_spec().name, name, length);
}

static void memory(unsigned gpu, unsigned long long *total, unsigned long long *used) {
    holder *hs = calloc(MAX_HOLDERS, sizeof *hs);
    int n = hs ? load_holders(hs, MAX_HOLDERS) : 0;
    *total = (unsigned long long)load_spec().memory_mib * MIB;
    *used = 0;
    for (int i = 0; i < n; i++)
        if (holds(&hs[i], gpu)) *used += (unsigned long long)hs[i].mib * MIB;
    free(hs);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *out) {
    nvmlReturn_t r = device_ok(device);
    if (r) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    memory(device->index, &out->total, &out->used);
    out->free = out->used < out->total ? out->total - out->used : 0;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *out) {
    nvmlReturn_t r = device_ok(device);
    if (r) return r;
    if (getenv("STANDIN_NVML_NO_MEMORY_V2")) return NVML_ERROR_FUNCTION_NOT_FOUND;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (out->version != MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memory(device->index, &out->total, &out->used);
    out->reserved = 0;
    out->free = out->used < out->total ? out->total - out->used : 0;
    return NVML_SUCCESS;
}

/* NVML's two-call protocol: too small a count (0 with NULL infos, the size query) answers
 * NVML_ERROR_INSUFFICIENT_SIZE with the count needed; no processes answers 0 and success. */
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *count,
                                                     nvmlProcessInfo_t *infos) {
    holder *hs;
    unsigned k = 0;
    int n;
    nvmlReturn_t r = device_ok(device);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(hs = calloc(MAX_HOLDERS, sizeof *hs))) return NVML_ERROR_UNKNOWN;
    n = load_holders(hs, MAX_HOLDERS);
    for (int i = 0; i < n; i++) k += (unsigned)holds(&hs[i], device->index);
    if (k > *count || (k && !infos)) { *count = k; free(hs); return NVML_ERROR_INSUFFICIENT_SIZE; }
    *count = k;
    k = 0;
    for (int i = 0; i < n; i++) {
        if (!holds(&hs[i], device->index)) continue;
        infos[k].pid = (unsigned)hs[i].pid;
        infos[k].usedGpuMemory = (unsigned long long)hs[i].mib * MIB;
        infos[k].gpuInstanceId = infos[k].computeInstanceId = 0xFFFFFFFFu; /* not MIG */
        k++;
    }
    free(hs);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    holder *hs;
    nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
    int n;
    if (!initialised) return NVML_ERROR_UNINITIALIZED;
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    if (!(hs = calloc(MAX_HOLDERS, sizeof *hs))) return NVML_ERROR_UNKNOWN;
    n = load_holders(hs, MAX_HOLDERS);
    for (int i = 0; i < n && r; i++)
        if (hs[i].pid == (long long)pid) {
            /* the real one truncates to length (pynvml asks 1024) */
            strncpy(name, hs[i].name, length - 1);
            name[length - 1] = '\0';
            r = NVML_SUCCESS;
        }
    free(hs);
    return r;
}
