/* Tests of the batch format (fb_batch) and the outbox (fb_outbox). */
#include "ctest.h"
#include "fb_outbox.h"

static void test_crc32c(void)
{
    /* The standard check value of CRC-32C. */
    CHECK_EQ(fb_crc32c(0, "123456789", 9), 0xE3069283u);
    CHECK_EQ(fb_crc32c(0, "", 0), 0);
    /* Incremental use gives the same result. */
    uint32_t c = fb_crc32c(0, "1234", 4);
    CHECK_EQ(fb_crc32c(c, "56789", 5), 0xE3069283u);
    /* Long unaligned input: hardware and table paths agree with incremental. */
    unsigned char buf[1000];
    for (int i = 0; i < 1000; i++) buf[i] = (unsigned char)(i * 7);
    uint32_t whole = fb_crc32c(0, buf + 1, 999);
    uint32_t part = fb_crc32c(fb_crc32c(0, buf + 1, 333), buf + 334, 666);
    CHECK_EQ(whole, part);
}

static void test_empty_batch(void)
{
    for (int checksum = 0; checksum <= 1; checksum++) {
        unsigned char *b = NULL;
        size_t len = 0;
        REQUIRE(fb_batch_empty(checksum, &b, &len) == FB_OK);
        CHECK_EQ(len, (size_t)(FB_BATCH_HEADER + (checksum ? 4 : 0)));
        uint32_t count = 99;
        uint8_t flags = 0xff;
        CHECK_EQ(fb_batch_header(b, len, &count, &flags), FB_OK);
        CHECK_EQ(count, 0);
        CHECK_EQ(flags, checksum ? FB_BATCH_F_CRC32C : 0);
        /* It decodes, also where a checksum is required when it has one. */
        fb_decode_limits lim = { 0, 0, 0, checksum };
        size_t n = 7;
        CHECK_EQ(fb_batch_decode(b, len, &lim, NULL, 0, &n), FB_OK);
        CHECK_EQ(n, 0);
        if (checksum) {                 /* and the trailer is checked */
            b[len - 1] ^= 1;
            CHECK_EQ(fb_batch_decode(b, len, NULL, NULL, 0, &n), FB_ECHECKSUM);
        }
        fb_free(b);
    }
}

static unsigned char *make_batch(int checksum, size_t *len, size_t nrec)
{
    fb_outbox_limits lim = { 0, 0, 0, checksum };
    fb_outbox o;
    fb_outbox_init(&o, &lim);
    char topic[32], payload[300];
    for (size_t i = 0; i < nrec; i++) {
        int tl = snprintf(topic, sizeof topic, "t.%zu", i);
        size_t pl = (i * 37) % 300;
        memset(payload, (int)('a' + i % 26), pl);
        REQUIRE(fb_outbox_append(&o, topic, (size_t)tl, payload, pl, 0) >= 0);
    }
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    fb_outbox_destroy(&o);
    return b;
}

static void test_roundtrip(void)
{
    for (int cs = 0; cs < 2; cs++) {
        size_t len, n;
        unsigned char *b = make_batch(cs, &len, 50);
        uint32_t count;
        uint8_t flags;
        CHECK_EQ(fb_batch_header(b, len, &count, &flags), FB_OK);
        CHECK_EQ(count, 50);
        CHECK_EQ(flags, cs ? FB_BATCH_F_CRC32C : 0);
        fb_record recs[50];
        CHECK_EQ(fb_batch_decode(b, len, NULL, recs, 50, &n), FB_OK);
        CHECK_EQ(n, 50);
        for (size_t i = 0; i < n; i++) {
            char topic[32];
            int tl = snprintf(topic, sizeof topic, "t.%zu", i);
            CHECK_EQ(recs[i].topic_len, tl);
            CHECK(!memcmp(recs[i].topic, topic, (size_t)tl));
            CHECK_EQ(recs[i].payload_len, (i * 37) % 300);
            for (size_t j = 0; j < recs[i].payload_len; j++) CHECK(recs[i].payload[j] == 'a' + i % 26);
        }
        CHECK_EQ(fb_batch_decode(b, len, NULL, recs, 49, &n), FB_EINVAL);   /* out too small */
        CHECK_EQ(fb_batch_decode(b, len, NULL, NULL, 0, &n), FB_OK);        /* validate only */
        fb_decode_limits lim = { 8, 0, 0, 0 };
        CHECK_EQ(fb_batch_decode(b, len, &lim, NULL, 0, &n), FB_OK);
        lim.max_topic = 3;
        CHECK_EQ(fb_batch_decode(b, len, &lim, NULL, 0, &n), FB_ELIMIT);
        fb_decode_limits lim2 = { 0, 100, 0, 0 };
        CHECK_EQ(fb_batch_decode(b, len, &lim2, NULL, 0, &n), FB_ELIMIT);
        fb_decode_limits lim3 = { 0, 0, 49, 0 };
        CHECK_EQ(fb_batch_decode(b, len, &lim3, NULL, 0, &n), FB_ELIMIT);
        fb_decode_limits lim4 = { 0, 0, 0, 1 };
        CHECK_EQ(fb_batch_decode(b, len, &lim4, NULL, 0, &n), cs ? FB_OK : FB_ECHECKSUM);
        fb_free(b);
    }
}

static void test_every_truncation(void)
{
    for (int cs = 0; cs < 2; cs++) {
        size_t len, n;
        unsigned char *b = make_batch(cs, &len, 20);
        for (size_t cut = 0; cut < len; cut++) {
            unsigned char *c = malloc(cut ? cut : 1);   /* exact-size copy: ASan sees any overread */
            memcpy(c, b, cut);
            int rc = fb_batch_decode(c, cut, NULL, NULL, 0, &n);
            CHECK(rc < 0);
            CHECK_EQ(n, 0);
            free(c);
        }
        fb_free(b);
    }
}

/* Every single-byte change of batch b (a step of `delta` through the byte
 * values): with the checksum (cs) rejected; without it, rejected or
 * decoded within the buffer, headers included (ASan sees any overread). */
static void check_corruptions(const unsigned char *b, size_t len, int cs, int delta_step)
{
    size_t n;
    fb_record *recs = malloc(len * sizeof *recs);
    for (size_t pos = 0; pos < len; pos++) {
        for (int delta = 1; delta < 256; delta += delta_step) {
            unsigned char *c = malloc(len);
            memcpy(c, b, len);
            c[pos] = (unsigned char)(c[pos] + delta);
            int rc = fb_batch_decode(c, len, NULL, recs, len, &n);
            if (cs) CHECK(rc < 0);
            if (rc == FB_OK)
                for (size_t i = 0; i < n; i++) {
                    CHECK(recs[i].topic >= c && recs[i].topic + recs[i].topic_len <= c + len);
                    CHECK(recs[i].payload >= c && recs[i].payload + recs[i].payload_len <= c + len);
                    const unsigned char *p = recs[i].headers, *end = p + recs[i].headers_len;
                    fb_header h;
                    while (fb_headers_next(&p, end, &h)) {
                        CHECK(h.key >= c && h.key + h.key_len <= end);
                        CHECK(h.value >= c && h.value + h.value_len <= end);
                    }
                    CHECK(p == end);
                }
            free(c);
        }
    }
    free(recs);
}

/* Every prefix of a batch (each in a buffer of its own size, so ASan sees a
 * read past it) is rejected. */
static void check_truncations(const unsigned char *b, size_t len)
{
    size_t n;
    for (size_t cut = 0; cut < len; cut++) {
        unsigned char *c = malloc(cut ? cut : 1);
        memcpy(c, b, cut);
        CHECK(fb_batch_decode(c, cut, NULL, NULL, 0, &n) < 0);
        free(c);
    }
}

static void test_every_corruption(void)
{
    for (int cs = 0; cs < 2; cs++) {
        size_t len;
        unsigned char *b = make_batch(cs, &len, 12);
        check_corruptions(b, len, cs, 37);
        fb_free(b);
    }
}

static void test_hostile_inputs(void)
{
    size_t n;
    uint32_t cnt;
    /* Wrong magic, even in a short buffer. */
    CHECK_EQ(fb_batch_decode("X", 1, NULL, NULL, 0, &n), FB_EMALFORMED);
    CHECK_EQ(fb_batch_decode("FB", 2, NULL, NULL, 0, &n), FB_ETRUNCATED);
    CHECK_EQ(fb_batch_header("", 0, &cnt, NULL), FB_ETRUNCATED);
    unsigned char h[64] = { 'F', 'B', 1, 0, 1, 0, 0, 0 };
    /* Unknown version and flags. */
    h[2] = 2;
    CHECK_EQ(fb_batch_decode(h, 8, NULL, NULL, 0, &n), FB_EVERSION);
    h[2] = 1; h[3] = 0x80;
    CHECK_EQ(fb_batch_decode(h, 8, NULL, NULL, 0, &n), FB_EVERSION);
    h[3] = 0;
    /* A count the buffer cannot hold. */
    h[4] = h[5] = h[6] = h[7] = 0xff;
    CHECK_EQ(fb_batch_decode(h, 10, NULL, NULL, 0, &n), FB_ETRUNCATED);
    h[4] = 1; h[5] = h[6] = h[7] = 0;
    /* One record: non-minimal varint (0x80 0x00). */
    h[8] = 0x80; h[9] = 0x00; h[10] = 0x00;
    CHECK_EQ(fb_batch_decode(h, 11, NULL, NULL, 0, &n), FB_EMALFORMED);
    /* A varint beyond 32 bits. */
    unsigned char v[] = { 'F', 'B', 1, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x1f, 0x00 };
    CHECK_EQ(fb_batch_decode(v, sizeof v, NULL, NULL, 0, &n), FB_EMALFORMED);
    /* A 4 GB length in a small buffer. */
    unsigned char w[] = { 'F', 'B', 1, 0, 1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x00, 'x' };
    CHECK_EQ(fb_batch_decode(w, sizeof w, NULL, NULL, 0, &n), FB_ETRUNCATED);
    /* Trailing bytes after the declared records. */
    unsigned char t[] = { 'F', 'B', 1, 0, 1, 0, 0, 0, 1, 1, 'a', 'b', 'z' };
    CHECK_EQ(fb_batch_decode(t, sizeof t, NULL, NULL, 0, &n), FB_EMALFORMED);
    CHECK_EQ(fb_batch_decode(t, sizeof t - 1, NULL, NULL, 0, &n), FB_OK);
    /* Zero records is a valid (empty) batch. */
    unsigned char z[] = { 'F', 'B', 1, 0, 0, 0, 0, 0 };
    CHECK_EQ(fb_batch_decode(z, sizeof z, NULL, NULL, 0, &n), FB_OK);
    CHECK_EQ(n, 0);
    /* Checksum flag on a buffer too short for the trailer. */
    unsigned char c[] = { 'F', 'B', 1, 1, 0, 0, 0, 0, 0 };
    CHECK_EQ(fb_batch_decode(c, sizeof c, NULL, NULL, 0, &n), FB_ETRUNCATED);
}

static void test_outbox_policy(void)
{
    fb_outbox_limits lim = { 3, 0, 1000, 0 };
    fb_outbox o;
    fb_outbox_init(&o, &lim);
    unsigned char *b;
    size_t len;
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);   /* empty */
    CHECK(b == NULL && len == 0);
    CHECK_EQ(fb_outbox_due(&o, 5000), 0);
    CHECK_EQ(fb_outbox_deadline(&o), UINT64_MAX);
    CHECK_EQ(fb_outbox_append(&o, "a", 1, "x", 1, 100), 0);
    CHECK_EQ(fb_outbox_deadline(&o), 1100);
    CHECK_EQ(fb_outbox_due(&o, 1099), 0);
    CHECK_EQ(fb_outbox_due(&o, 1100), 1);           /* by age of the oldest record */
    CHECK_EQ(fb_outbox_due(&o, 50), 0);             /* a clock behind the record */
    CHECK_EQ(fb_outbox_append(&o, "a", 1, "y", 1, 900), 0);
    CHECK_EQ(fb_outbox_deadline(&o), 1100);          /* still the oldest */
    CHECK_EQ(fb_outbox_append(&o, "a", 1, "z", 1, 901), 1);   /* by count */
    CHECK_EQ(fb_outbox_count(&o), 3);
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);
    CHECK_EQ(fb_outbox_count(&o), 0);
    CHECK_EQ(fb_outbox_bytes(&o), 0);
    size_t n;
    fb_record r[3];
    CHECK_EQ(fb_batch_decode(b, len, NULL, r, 3, &n), FB_OK);
    CHECK(r[0].payload[0] == 'x' && r[1].payload[0] == 'y' && r[2].payload[0] == 'z');
    fb_free(b);
    fb_outbox_destroy(&o);

    fb_outbox_limits blim = { 0, 64, 0, 1 };
    fb_outbox_init(&o, &blim);
    char big[100] = { 0 };
    CHECK_EQ(fb_outbox_append(&o, "t", 1, big, 10, 0), 0);
    CHECK_EQ(fb_outbox_bytes(&o), 8 + 2 + 11 + 4);
    CHECK_EQ(fb_outbox_append(&o, "t", 1, big, 100, 0), 1);   /* by size; never dropped */
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);
    CHECK_EQ(fb_batch_decode(b, len, NULL, r, 3, &n), FB_OK);
    CHECK_EQ(n, 2);
    CHECK_EQ(r[1].payload_len, 100);
    fb_free(b);
    /* Binary topics and empty fields. */
    CHECK_EQ(fb_outbox_append(&o, "\0\xff", 2, NULL, 0, 0), 0);
    CHECK_EQ(fb_outbox_append(&o, NULL, 0, "p", 1, 0), 0);
    CHECK_EQ(fb_outbox_append(&o, NULL, 3, "p", 1, 0), FB_EINVAL);
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);
    CHECK_EQ(fb_batch_decode(b, len, NULL, r, 3, &n), FB_OK);
    CHECK(n == 2 && r[0].topic_len == 2 && r[0].topic[1] == 0xff && r[0].payload_len == 0);
    CHECK(r[1].topic_len == 0 && r[1].payload_len == 1);
    fb_free(b);
    fb_outbox_clear(&o);
    fb_outbox_destroy(&o);
}

/* A header block of `n` headers k0=v.., k1=v..: its bytes in buf. */
static size_t make_block(unsigned char *buf, size_t n)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        char k[16], v[16];
        int kl = snprintf(k, sizeof k, "k%zu", i), vl = snprintf(v, sizeof v, "v%zu", i * 11);
        at += fb_put_varint(buf + at, (uint32_t)kl);
        memcpy(buf + at, k, (size_t)kl);
        at += (size_t)kl;
        at += fb_put_varint(buf + at, (uint32_t)vl);
        memcpy(buf + at, v, (size_t)vl);
        at += (size_t)vl;
    }
    return at;
}

/* Records "t.i" whose i % 3 headers; the first `plain` without any, so the
 * outbox rewrites them when the first with headers comes. */
static unsigned char *make_hbatch(int checksum, size_t *len, size_t nrec, size_t plain)
{
    fb_outbox_limits lim = { 0, 0, 0, checksum };
    fb_outbox o;
    fb_outbox_init(&o, &lim);
    char topic[32], payload[300];
    unsigned char block[256];
    for (size_t i = 0; i < nrec; i++) {
        int tl = snprintf(topic, sizeof topic, "t.%zu", i);
        size_t pl = (i * 37) % 300, bl = i < plain ? 0 : make_block(block, i % 3);
        memset(payload, (int)('a' + i % 26), pl);
        REQUIRE(fb_outbox_append_h(&o, topic, (size_t)tl, block, bl, payload, pl, 0) >= 0);
    }
    unsigned char *b;
    REQUIRE(fb_outbox_take(&o, &b, len) == FB_OK);
    fb_outbox_destroy(&o);
    return b;
}

static void check_hbatch(const unsigned char *b, size_t len, size_t nrec, size_t plain)
{
    fb_record recs[64];
    size_t n;
    REQUIRE(nrec <= 64);
    CHECK_EQ(fb_batch_decode(b, len, NULL, recs, 64, &n), FB_OK);
    CHECK_EQ(n, nrec);
    for (size_t i = 0; i < n; i++) {
        char topic[32];
        int tl = snprintf(topic, sizeof topic, "t.%zu", i);
        CHECK(recs[i].topic_len == (uint32_t)tl && !memcmp(recs[i].topic, topic, (size_t)tl));
        CHECK_EQ(recs[i].payload_len, (i * 37) % 300);
        for (size_t j = 0; j < recs[i].payload_len; j++) CHECK(recs[i].payload[j] == 'a' + i % 26);
        unsigned char block[256];
        size_t bl = i < plain ? 0 : make_block(block, i % 3);
        CHECK_EQ(recs[i].headers_len, bl);
        CHECK(bl ? recs[i].headers != NULL && !memcmp(recs[i].headers, block, bl) : recs[i].headers == NULL);
        /* Walking the block gives the headers back, in order. */
        const unsigned char *p = recs[i].headers, *end = p + recs[i].headers_len;
        fb_header h;
        size_t k = 0;
        while (fb_headers_next(&p, end, &h)) {
            char key[16], val[16];
            int kl = snprintf(key, sizeof key, "k%zu", k), vl = snprintf(val, sizeof val, "v%zu", k * 11);
            CHECK(h.key_len == (uint32_t)kl && !memcmp(h.key, key, (size_t)kl));
            CHECK(h.value_len == (uint32_t)vl && !memcmp(h.value, val, (size_t)vl));
            k++;
        }
        CHECK_EQ(k, bl ? i % 3 : 0);
    }
}

static void test_headers(void)
{
    for (int cs = 0; cs < 2; cs++) {
        size_t len, n;
        uint8_t flags;
        uint32_t count;
        /* Headers from the first record, from the 7th (six rewritten), and
         * never (then the batch is the header-less format). */
        size_t plains[] = { 0, 6, 40 };
        for (size_t k = 0; k < 3; k++) {
            unsigned char *b = make_hbatch(cs, &len, 40, plains[k]);
            CHECK_EQ(fb_batch_header(b, len, &count, &flags), FB_OK);
            CHECK_EQ(flags, (cs ? FB_BATCH_F_CRC32C : 0) | (plains[k] < 40 ? FB_BATCH_F_HEADERS : 0));
            check_hbatch(b, len, 40, plains[k]);
            if (plains[k] == 40) {       /* byte for byte what fb_outbox_append makes */
                size_t len2;
                unsigned char *b2 = make_batch(cs, &len2, 40);
                CHECK(len == len2 && !memcmp(b, b2, len));
                fb_free(b2);
            }
            fb_free(b);
        }
        /* max_payload counts payload and headers together. */
        unsigned char *b = make_hbatch(cs, &len, 40, 0);
        uint32_t most = 0;
        unsigned char blk0[256];
        for (size_t i = 0; i < 40; i++) {
            uint32_t both = (uint32_t)((i * 37) % 300 + make_block(blk0, i % 3));
            if (both > most) most = both;
        }
        fb_decode_limits lim = { 0, most, 0, 0 };
        CHECK_EQ(fb_batch_decode(b, len, &lim, NULL, 0, &n), FB_OK);
        lim.max_payload = most - 1;
        CHECK_EQ(fb_batch_decode(b, len, &lim, NULL, 0, &n), FB_ELIMIT);
        /* Every truncation is rejected; every corruption too with the
         * checksum, and decodes within the buffer without it. */
        check_truncations(b, len);
        check_corruptions(b, len, cs, 61);
        fb_free(b);
    }
    /* The documented example: ("t", {"k": "v"}, "p"), one record. */
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    unsigned char blk[] = { 1, 'k', 1, 'v' }, *b;
    size_t len, n;
    CHECK_EQ(fb_outbox_append_h(&o, "t", 1, blk, 4, "p", 1, 0), 0);
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);
    unsigned char want[] = { 'F', 'B', 1, 2, 1, 0, 0, 0, 1, 1, 4, 't', 1, 'k', 1, 'v', 'p' };
    CHECK(len == sizeof want && !memcmp(b, want, len));
    fb_free(b);
    /* A RESP outbox leaves headers out (Redis's PUBLISH has none). */
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, "PUBLISH"), FB_OK);
    CHECK_EQ(fb_outbox_append_h(&o, "t", 1, blk, 4, "p", 1, 0), 0);
    CHECK_EQ(fb_outbox_take(&o, &b, &len), FB_OK);
    static const char cmd[] = "*3\r\n$7\r\nPUBLISH\r\n$1\r\nt\r\n$1\r\np\r\n";
    CHECK(len == sizeof cmd - 1 && !memcmp(b, cmd, len));
    fb_free(b);
    fb_outbox_destroy(&o);
    /* Bad blocks: an empty key, a key or value past the block, a
     * non-minimal length; each rejected by the decoder. */
    unsigned char bad[][6] = { { 0, 1, 'v' }, { 3, 'k', 1, 'v' }, { 1, 'k', 3, 'v' }, { 0x81, 0, 'k', 1, 'v' } };
    size_t badlen[] = { 3, 4, 4, 5 };
    for (size_t i = 0; i < 4; i++) {
        CHECK(!fb_headers_valid(bad[i], badlen[i]));
        unsigned char r[32] = { 'F', 'B', 1, 2, 1, 0, 0, 0, 1, 0, (unsigned char)badlen[i], 't' };
        memcpy(r + 12, bad[i], badlen[i]);
        CHECK_EQ(fb_batch_decode(r, 12 + badlen[i], NULL, NULL, 0, &n), FB_EMALFORMED);
    }
    CHECK(fb_headers_valid(blk, 4) && fb_headers_valid(blk, 0));
    /* A count a headers batch cannot hold (three bytes a record). */
    unsigned char z[] = { 'F', 'B', 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0 };
    CHECK_EQ(fb_batch_decode(z, sizeof z, NULL, NULL, 0, &n), FB_ETRUNCATED);
    CHECK_EQ(fb_batch_decode(z, sizeof z - 1, NULL, NULL, 0, &n), FB_ETRUNCATED);
    unsigned char z2[] = { 'F', 'B', 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0 };
    CHECK_EQ(fb_batch_decode(z2, sizeof z2, NULL, NULL, 0, &n), FB_OK);
    CHECK_EQ(n, 2);
}

/* Repeats (FB_BATCH_F_HEADERS_AGAIN): an outbox with them on writes a block
 * that is the record before's as one length byte; the decoder gives every
 * record its whole block back; what a repeat may not be is rejected. */
static void test_headers_again(void)
{
    unsigned char blk[64], other[64];
    size_t bl = make_block(blk, 2), ol = make_block(other, 1);
    for (int cs = 0; cs < 2; cs++) {
        fb_outbox_limits lim = { 0, 0, 0, cs };
        fb_outbox on, off;
        fb_outbox_init(&on, &lim);
        fb_outbox_init(&off, &lim);
        fb_outbox_set_again(&on, 1);
        /* The blocks of records 0..11: the same run, a change, none, the
         * first again (not a repeat: the record before had none). */
        const unsigned char *want[12];
        size_t wantl[12];
        for (size_t i = 0; i < 12; i++) {
            int none = i == 7, alt = i == 4 || i == 5;
            want[i] = none ? NULL : alt ? other : blk;
            wantl[i] = none ? 0 : alt ? ol : bl;
            REQUIRE(fb_outbox_append_h(&on, "t", 1, want[i], wantl[i], "pp", 2, 0) >= 0);
            REQUIRE(fb_outbox_append_h(&off, "t", 1, want[i], wantl[i], "pp", 2, 0) >= 0);
        }
        unsigned char *a, *b;
        size_t al, blen, n;
        CHECK_EQ(fb_outbox_take(&on, &a, &al), FB_OK);
        CHECK_EQ(fb_outbox_take(&off, &b, &blen), FB_OK);
        CHECK(a[3] & FB_BATCH_F_HEADERS_AGAIN);
        CHECK(!(b[3] & FB_BATCH_F_HEADERS_AGAIN));
        /* Repeats at records 1-3, 5 and 9-11: those blocks not carried. */
        CHECK_EQ(blen - al, 6 * bl + ol);     /* (each repeat: a length byte, as the block's own) */
        fb_record ra[12], rb[12];
        CHECK_EQ(fb_batch_decode(a, al, NULL, ra, 12, &n), FB_OK);
        CHECK_EQ(n, 12);
        CHECK_EQ(fb_batch_decode(b, blen, NULL, rb, 12, &n), FB_OK);
        for (size_t i = 0; i < 12; i++) {
            CHECK_EQ(ra[i].headers_len, wantl[i]);
            CHECK(wantl[i] ? !memcmp(ra[i].headers, want[i], wantl[i]) : ra[i].headers == NULL);
            CHECK(ra[i].payload_len == 2 && !memcmp(ra[i].payload, "pp", 2));
            CHECK(ra[i].topic_len == 1 && ra[i].topic[0] == 't');
            CHECK(rb[i].headers_len == ra[i].headers_len);
        }
        /* max_payload counts a repeated block as a carried one. */
        fb_decode_limits dl = { 0, (uint32_t)(2 + bl), 0, 0 };
        CHECK_EQ(fb_batch_decode(a, al, &dl, NULL, 0, &n), FB_OK);
        dl.max_payload = (uint32_t)(1 + bl);
        CHECK_EQ(fb_batch_decode(a, al, &dl, NULL, 0, &n), FB_ELIMIT);
        /* Every truncation rejected, every corruption too with the
         * checksum, none read outside the buffer without it. */
        check_truncations(a, al);
        check_corruptions(a, al, cs, 1);
        fb_free(a);
        fb_free(b);
        /* A batch taken starts again without: its first record carries its block. */
        REQUIRE(fb_outbox_append_h(&on, "t", 1, blk, bl, "p", 1, 0) >= 0);
        CHECK_EQ(fb_outbox_take(&on, &a, &al), FB_OK);
        CHECK(!(a[3] & FB_BATCH_F_HEADERS_AGAIN));
        fb_free(a);
        fb_outbox_destroy(&on);
        fb_outbox_destroy(&off);
    }
    size_t n;
    /* A repeat in the first record, after a record without headers, in a
     * batch without the flag, or the flag without headers: malformed. */
    unsigned char first[] = { 'F', 'B', 1, 6, 1, 0, 0, 0, 1, 1, 1, 't', 'p' };
    CHECK_EQ(fb_batch_decode(first, sizeof first, NULL, NULL, 0, &n), FB_EMALFORMED);
    unsigned char after_none[] = { 'F', 'B', 1, 6, 2, 0, 0, 0, 1, 1, 0, 't', 'p', 1, 1, 1, 't', 'p' };
    CHECK_EQ(fb_batch_decode(after_none, sizeof after_none, NULL, NULL, 0, &n), FB_EMALFORMED);
    unsigned char ok[] = { 'F', 'B', 1, 6, 2, 0, 0, 0, 1, 1, 4, 't', 1, 'k', 1, 'v', 'p', 1, 1, 1, 't', 'q' };
    fb_record r[2];
    CHECK_EQ(fb_batch_decode(ok, sizeof ok, NULL, r, 2, &n), FB_OK);
    CHECK(n == 2 && r[1].headers == r[0].headers && r[1].headers_len == 4 && r[1].payload[0] == 'q');
    ok[3] = 2;                                  /* no repeats flag: a 1-byte block is refused */
    CHECK(fb_batch_decode(ok, sizeof ok, NULL, NULL, 0, &n) < 0);
    unsigned char flag_only[] = { 'F', 'B', 1, 4, 1, 0, 0, 0, 1, 1, 't', 'p' };
    CHECK_EQ(fb_batch_decode(flag_only, sizeof flag_only, NULL, NULL, 0, &n), FB_EMALFORMED);
    /* A repeat of a block over FB_HEADERS_AGAIN_MAX: malformed (a few bytes
     * may not stand for much more); the outbox carries such a block again. */
    size_t big = FB_HEADERS_AGAIN_MAX + 1;
    unsigned char *hb = malloc(big);
    hb[0] = 1;
    hb[1] = 'k';
    size_t vl = big - 4;                        /* key length, key, a two-byte value length */
    hb[2] = (unsigned char)(0x80 | (vl & 0x7f));
    hb[3] = (unsigned char)(vl >> 7);
    memset(hb + 4, 'v', vl);
    REQUIRE(fb_headers_valid(hb, big));
    fb_outbox o;
    fb_outbox_init(&o, NULL);
    fb_outbox_set_again(&o, 1);
    REQUIRE(fb_outbox_append_h(&o, "t", 1, hb, big, "p", 1, 0) >= 0);
    REQUIRE(fb_outbox_append_h(&o, "t", 1, hb, big, "p", 1, 0) >= 0);
    unsigned char *bb;
    size_t bbl;
    CHECK_EQ(fb_outbox_take(&o, &bb, &bbl), FB_OK);
    CHECK(!(bb[3] & FB_BATCH_F_HEADERS_AGAIN));
    CHECK_EQ(fb_batch_decode(bb, bbl, NULL, NULL, 0, &n), FB_OK);
    /* The same batch with its second block made a repeat by hand. */
    size_t rec2 = FB_BATCH_HEADER + (bbl - FB_BATCH_HEADER) / 2;   /* where the second record starts */
    unsigned char *hand = malloc(bbl);
    memcpy(hand, bb, rec2);
    hand[3] |= FB_BATCH_F_HEADERS_AGAIN;
    unsigned char tail[] = { 1, 1, 1, 't', 'p' };
    memcpy(hand + rec2, tail, sizeof tail);
    CHECK_EQ(fb_batch_decode(hand, rec2 + sizeof tail, NULL, NULL, 0, &n), FB_EMALFORMED);
    free(hand);
    fb_free(bb);
    free(hb);
    fb_outbox_destroy(&o);
}

int main(void)
{
    RUN(test_crc32c);
    RUN(test_empty_batch);
    RUN(test_roundtrip);
    RUN(test_every_truncation);
    RUN(test_every_corruption);
    RUN(test_hostile_inputs);
    RUN(test_outbox_policy);
    RUN(test_headers);
    RUN(test_headers_again);
    CTEST_END();
}
