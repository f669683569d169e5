/* fb_batch.c - batch format v1 decoder and CRC32C (see fb_batch.h). */
#include "fb_batch.h"

#include <stdlib.h>
#include <string.h>

static const uint32_t crc_table[256] = {
    0x00000000u, 0xf26b8303u, 0xe13b70f7u, 0x1350f3f4u, 0xc79a971fu, 0x35f1141cu,
    0x26a1e7e8u, 0xd4ca64ebu, 0x8ad958cfu, 0x78b2dbccu, 0x6be22838u, 0x9989ab3bu,
    0x4d43cfd0u, 0xbf284cd3u, 0xac78bf27u, 0x5e133c24u, 0x105ec76fu, 0xe235446cu,
    0xf165b798u, 0x030e349bu, 0xd7c45070u, 0x25afd373u, 0x36ff2087u, 0xc494a384u,
    0x9a879fa0u, 0x68ec1ca3u, 0x7bbcef57u, 0x89d76c54u, 0x5d1d08bfu, 0xaf768bbcu,
    0xbc267848u, 0x4e4dfb4bu, 0x20bd8edeu, 0xd2d60dddu, 0xc186fe29u, 0x33ed7d2au,
    0xe72719c1u, 0x154c9ac2u, 0x061c6936u, 0xf477ea35u, 0xaa64d611u, 0x580f5512u,
    0x4b5fa6e6u, 0xb93425e5u, 0x6dfe410eu, 0x9f95c20du, 0x8cc531f9u, 0x7eaeb2fau,
    0x30e349b1u, 0xc288cab2u, 0xd1d83946u, 0x23b3ba45u, 0xf779deaeu, 0x05125dadu,
    0x1642ae59u, 0xe4292d5au, 0xba3a117eu, 0x4851927du, 0x5b016189u, 0xa96ae28au,
    0x7da08661u, 0x8fcb0562u, 0x9c9bf696u, 0x6ef07595u, 0x417b1dbcu, 0xb3109ebfu,
    0xa0406d4bu, 0x522bee48u, 0x86e18aa3u, 0x748a09a0u, 0x67dafa54u, 0x95b17957u,
    0xcba24573u, 0x39c9c670u, 0x2a993584u, 0xd8f2b687u, 0x0c38d26cu, 0xfe53516fu,
    0xed03a29bu, 0x1f682198u, 0x5125dad3u, 0xa34e59d0u, 0xb01eaa24u, 0x42752927u,
    0x96bf4dccu, 0x64d4cecfu, 0x77843d3bu, 0x85efbe38u, 0xdbfc821cu, 0x2997011fu,
    0x3ac7f2ebu, 0xc8ac71e8u, 0x1c661503u, 0xee0d9600u, 0xfd5d65f4u, 0x0f36e6f7u,
    0x61c69362u, 0x93ad1061u, 0x80fde395u, 0x72966096u, 0xa65c047du, 0x5437877eu,
    0x4767748au, 0xb50cf789u, 0xeb1fcbadu, 0x197448aeu, 0x0a24bb5au, 0xf84f3859u,
    0x2c855cb2u, 0xdeeedfb1u, 0xcdbe2c45u, 0x3fd5af46u, 0x7198540du, 0x83f3d70eu,
    0x90a324fau, 0x62c8a7f9u, 0xb602c312u, 0x44694011u, 0x5739b3e5u, 0xa55230e6u,
    0xfb410cc2u, 0x092a8fc1u, 0x1a7a7c35u, 0xe811ff36u, 0x3cdb9bddu, 0xceb018deu,
    0xdde0eb2au, 0x2f8b6829u, 0x82f63b78u, 0x709db87bu, 0x63cd4b8fu, 0x91a6c88cu,
    0x456cac67u, 0xb7072f64u, 0xa457dc90u, 0x563c5f93u, 0x082f63b7u, 0xfa44e0b4u,
    0xe9141340u, 0x1b7f9043u, 0xcfb5f4a8u, 0x3dde77abu, 0x2e8e845fu, 0xdce5075cu,
    0x92a8fc17u, 0x60c37f14u, 0x73938ce0u, 0x81f80fe3u, 0x55326b08u, 0xa759e80bu,
    0xb4091bffu, 0x466298fcu, 0x1871a4d8u, 0xea1a27dbu, 0xf94ad42fu, 0x0b21572cu,
    0xdfeb33c7u, 0x2d80b0c4u, 0x3ed04330u, 0xccbbc033u, 0xa24bb5a6u, 0x502036a5u,
    0x4370c551u, 0xb11b4652u, 0x65d122b9u, 0x97baa1bau, 0x84ea524eu, 0x7681d14du,
    0x2892ed69u, 0xdaf96e6au, 0xc9a99d9eu, 0x3bc21e9du, 0xef087a76u, 0x1d63f975u,
    0x0e330a81u, 0xfc588982u, 0xb21572c9u, 0x407ef1cau, 0x532e023eu, 0xa145813du,
    0x758fe5d6u, 0x87e466d5u, 0x94b49521u, 0x66df1622u, 0x38cc2a06u, 0xcaa7a905u,
    0xd9f75af1u, 0x2b9cd9f2u, 0xff56bd19u, 0x0d3d3e1au, 0x1e6dcdeeu, 0xec064eedu,
    0xc38d26c4u, 0x31e6a5c7u, 0x22b65633u, 0xd0ddd530u, 0x0417b1dbu, 0xf67c32d8u,
    0xe52cc12cu, 0x1747422fu, 0x49547e0bu, 0xbb3ffd08u, 0xa86f0efcu, 0x5a048dffu,
    0x8ecee914u, 0x7ca56a17u, 0x6ff599e3u, 0x9d9e1ae0u, 0xd3d3e1abu, 0x21b862a8u,
    0x32e8915cu, 0xc083125fu, 0x144976b4u, 0xe622f5b7u, 0xf5720643u, 0x07198540u,
    0x590ab964u, 0xab613a67u, 0xb831c993u, 0x4a5a4a90u, 0x9e902e7bu, 0x6cfbad78u,
    0x7fab5e8cu, 0x8dc0dd8fu, 0xe330a81au, 0x115b2b19u, 0x020bd8edu, 0xf0605beeu,
    0x24aa3f05u, 0xd6c1bc06u, 0xc5914ff2u, 0x37faccf1u, 0x69e9f0d5u, 0x9b8273d6u,
    0x88d28022u, 0x7ab90321u, 0xae7367cau, 0x5c18e4c9u, 0x4f48173du, 0xbd23943eu,
    0xf36e6f75u, 0x0105ec76u, 0x12551f82u, 0xe03e9c81u, 0x34f4f86au, 0xc69f7b69u,
    0xd5cf889du, 0x27a40b9eu, 0x79b737bau, 0x8bdcb4b9u, 0x988c474du, 0x6ae7c44eu,
    0xbe2da0a5u, 0x4c4623a6u, 0x5f16d052u, 0xad7d5351u,
};

static uint32_t crc32c_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n--) crc = crc_table[(crc ^ *p++) & 0xffu] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FB_HAVE_CRC_HW 1
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t fb_crc32c(uint32_t crc, const void *buf, size_t len)
{
    crc = ~crc;
#ifdef FB_HAVE_CRC_HW
    /* __builtin_cpu_supports reads a table that a libgcc constructor fills
     * when the program or library is loaded. */
    if (__builtin_cpu_supports("sse4.2")) return ~crc32c_hw(crc, buf, len);
#endif
    return ~crc32c_sw(crc, buf, len);
}

static inline uint32_t rd32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int fb_batch_header(const void *buf, size_t len, uint32_t *count, uint8_t *flags)
{
    const unsigned char *p = buf;
    if (len && !p) return FB_EINVAL;
    /* Reject a wrong magic even in a short buffer: it is not a batch at all. */
    if ((len > 0 && p[0] != FB_BATCH_MAGIC0) || (len > 1 && p[1] != FB_BATCH_MAGIC1)) return FB_EMALFORMED;
    if (len < FB_BATCH_HEADER) return FB_ETRUNCATED;
    if (p[2] != FB_BATCH_VERSION || (p[3] & ~FB_BATCH_KNOWN_FLAGS)) return FB_EVERSION;
    if (count) *count = rd32(p + 4);
    if (flags) *flags = p[3];
    return FB_OK;
}

int fb_batch_empty(int checksum, unsigned char **buf, size_t *len)
{
    size_t n = FB_BATCH_HEADER + (checksum ? 4 : 0);
    unsigned char *p = malloc(n);
    *buf = p;
    *len = p ? n : 0;
    if (!p) return FB_ENOMEM;
    p[0] = FB_BATCH_MAGIC0;
    p[1] = FB_BATCH_MAGIC1;
    p[2] = FB_BATCH_VERSION;
    p[3] = checksum ? FB_BATCH_F_CRC32C : 0;
    memset(p + 4, 0, 4);                             /* count 0 */
    if (checksum) {
        uint32_t c = fb_crc32c(0, p, FB_BATCH_HEADER);
        for (int i = 0; i < 4; i++) p[FB_BATCH_HEADER + i] = (unsigned char)(c >> (8 * i));
    }
    return FB_OK;
}

/* Read one minimal LEB128 u32.  0: ok; FB_ETRUNCATED / FB_EMALFORMED. */
static inline int get_varint(const unsigned char **pp, const unsigned char *end, uint32_t *out)
{
    const unsigned char *p = *pp;
    if (p < end && *p < 0x80) { *out = *p; *pp = p + 1; return FB_OK; }
    uint32_t v = 0;
    for (unsigned i = 0; i < FB_VARINT_MAX; i++) {
        if (p >= end) return FB_ETRUNCATED;
        unsigned b = *p++;
        if (i == FB_VARINT_MAX - 1 && b > 0x0f) return FB_EMALFORMED; /* > 32 bits */
        v |= (uint32_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0) return FB_EMALFORMED;               /* not minimal */
            *out = v;
            *pp = p;
            return FB_OK;
        }
    }
    return FB_EMALFORMED;
}

int fb_headers_valid(const unsigned char *p, size_t len)
{
    const unsigned char *end = p + len;
    while (p < end) {
        uint32_t kl, vl;
        if (get_varint(&p, end, &kl) < 0 || kl == 0 || kl > (size_t)(end - p)) return 0;
        p += kl;
        if (get_varint(&p, end, &vl) < 0 || vl > (size_t)(end - p)) return 0;
        p += vl;
    }
    return 1;
}

int fb_headers_next(const unsigned char **pp, const unsigned char *end, fb_header *h)
{
    const unsigned char *p = *pp;
    if (p >= end) return 0;
    get_varint(&p, end, &h->key_len);            /* (checked by fb_headers_valid) */
    h->key = p;
    p += h->key_len;
    get_varint(&p, end, &h->value_len);
    h->value = p;
    *pp = p + h->value_len;
    return 1;
}

int fb_record_reply_to(const fb_record *rec, const unsigned char **to, uint32_t *len)
{
    static const unsigned char name[] = FB_HEADER_REPLY_TO;
    const size_t nl = sizeof name - 1;
    /* The first header's name length is one varint byte (9 < 0x80). */
    if (rec->headers_len < 1 + nl + 1 || rec->headers[0] != nl || memcmp(rec->headers + 1, name, nl) != 0)
        return 0;
    const unsigned char *p = rec->headers;
    fb_header h;
    fb_headers_next(&p, rec->headers + rec->headers_len, &h);   /* (a block the decoder checked) */
    *to = h.value;
    *len = h.value_len;
    return 1;
}

int fb_record_hold(const fb_record *rec, uint32_t *capacity, uint32_t *end)
{
    static const unsigned char name[] = FB_HEADER_HOLD;
    const size_t nl = sizeof name - 1;
    const unsigned char *to, *p, *hend = rec->headers + rec->headers_len;
    uint32_t tl;
    fb_header h = { 0 };
    if (!fb_record_reply_to(rec, &to, &tl)) return 0;
    p = to + tl;                                  /* past :reply-to (a block the decoder checked) */
    if (p >= hend || !fb_headers_next(&p, hend, &h) || h.key_len != nl || memcmp(h.key, name, nl) != 0)
        return 0;
    if (h.value_len < 1 || h.value_len > 10) return 0;
    uint64_t v = 0;
    for (uint32_t i = 0; i < h.value_len; i++) {
        if (h.value[i] < '0' || h.value[i] > '9') return 0;
        v = v * 10 + (uint64_t)(h.value[i] - '0');
    }
    if (v > UINT32_MAX) return 0;
    *capacity = (uint32_t)v;
    *end = (uint32_t)(p - rec->headers);
    return 1;
}

int fb_record_groups(const fb_record *rec, const unsigned char **marks, uint32_t *len, uint32_t *at,
                     uint32_t *span)
{
    static const unsigned char name[] = FB_HEADER_GROUPS;
    const size_t nl = sizeof name - 1;
    const unsigned char *p = rec->headers, *end = rec->headers + rec->headers_len;
    fb_header h;
    /* The first header, or the second after :reply-to (a block the decoder
     * checked). */
    for (int i = 0; i < 2 && p < end; i++) {
        const unsigned char *start = p;
        fb_headers_next(&p, end, &h);
        if (h.key_len == nl && memcmp(h.key, name, nl) == 0) {
            *marks = h.value;
            *len = h.value_len;
            *at = (uint32_t)(start - rec->headers);
            *span = (uint32_t)(p - start);
            return 1;
        }
        if (i == 0 && !(h.key_len == sizeof FB_HEADER_REPLY_TO - 1 &&
                        memcmp(h.key, FB_HEADER_REPLY_TO, h.key_len) == 0))
            break;
    }
    return 0;
}

int fb_groups_has(const unsigned char *marks, uint32_t len, const void *mark, uint32_t mark_len)
{
    const unsigned char *p = marks, *end = marks + len;
    while (p < end) {
        uint32_t ml;
        if (get_varint(&p, end, &ml) < 0 || ml > (size_t)(end - p)) return 0;   /* (network input) */
        if (ml == mark_len && memcmp(p, mark, ml) == 0) return 1;
        p += ml;
    }
    return 0;
}

uint32_t fb_groups_count(const unsigned char *marks, uint32_t len)
{
    const unsigned char *p = marks, *end = marks + len;
    uint32_t n = 0;
    while (p < end) {
        uint32_t ml;
        if (get_varint(&p, end, &ml) < 0 || ml > (size_t)(end - p)) break;
        p += ml;
        n += ml != 0;
    }
    return n;
}

int fb_groups_only(const unsigned char *marks, uint32_t len)
{
    return len > 0 && marks[0] == 0;
}

int fb_batch_decode(const void *buf, size_t len, const fb_decode_limits *lim,
                    fb_record *out, size_t out_cap, size_t *n)
{
    static const fb_decode_limits none = { 0, 0, 0, 0 };
    const unsigned char *p = buf;
    uint32_t count;
    uint8_t flags;
    if (n) *n = 0;
    if (!lim) lim = &none;
    int rc = fb_batch_header(buf, len, &count, &flags);
    if (rc < 0) return rc;
    const unsigned char *end = p + len;
    if (flags & FB_BATCH_F_CRC32C) {
        if (len < FB_BATCH_HEADER + 4) return FB_ETRUNCATED;
        end -= 4;
        if (fb_crc32c(0, p, (size_t)(end - p)) != rd32(end)) return FB_ECHECKSUM;
    } else if (lim->require_checksum) {
        return FB_ECHECKSUM;
    }
    if (lim->max_records && count > lim->max_records) return FB_ELIMIT;
    if (out && out_cap < count) return FB_EINVAL;
    /* Each record takes at least two bytes (three with headers): a larger
     * count cannot be true. */
    int has_headers = (flags & FB_BATCH_F_HEADERS) != 0;
    int again = has_headers && (flags & FB_BATCH_F_HEADERS_AGAIN);
    if ((flags & FB_BATCH_F_HEADERS_AGAIN) && !has_headers) return FB_EMALFORMED;
    if ((size_t)count > (size_t)(end - p - FB_BATCH_HEADER) / (has_headers ? 3 : 2)) return FB_ETRUNCATED;
    const unsigned char *q = p + FB_BATCH_HEADER;
    const unsigned char *prev_h = NULL;    /* the block of the record before (NULL: it had none) */
    uint32_t prev_hl = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t tl, pl, hl = 0, wire_hl;
        if ((rc = get_varint(&q, end, &tl)) < 0) return rc;
        if ((rc = get_varint(&q, end, &pl)) < 0) return rc;
        if (has_headers && (rc = get_varint(&q, end, &hl)) < 0) return rc;
        wire_hl = hl;
        const unsigned char *h = NULL;
        if (again && hl == FB_HEADERS_AGAIN_LEN) {
            if (!prev_h || prev_hl > FB_HEADERS_AGAIN_MAX) return FB_EMALFORMED;
            wire_hl = 0;                    /* nothing on the wire: the block before stands */
            h = prev_h;
            hl = prev_hl;
        }
        if ((lim->max_topic && tl > lim->max_topic) ||
            (lim->max_payload && (uint64_t)pl + hl > lim->max_payload))
            return FB_ELIMIT;
        size_t left = (size_t)(end - q);
        if ((size_t)tl > left || (size_t)wire_hl > left - tl || (size_t)pl > left - tl - wire_hl) return FB_ETRUNCATED;
        if (wire_hl) {
            h = q + tl;
            if (!fb_headers_valid(h, wire_hl)) return FB_EMALFORMED;
        }
        if (out) {
            out[i].topic = q;
            out[i].topic_len = tl;
            out[i].headers = h;
            out[i].headers_len = hl;
            out[i].payload = q + tl + wire_hl;
            out[i].payload_len = pl;
        }
        prev_h = h;
        prev_hl = hl;
        q += (size_t)tl + wire_hl + pl;
    }
    if (q != end) return FB_EMALFORMED; /* bytes after the last record */
    if (n) *n = count;
    return FB_OK;
}
