/*
 * route.c - the fastbus core embedded in a (toy) broker, with no Python.
 *
 * What a broker does with the core, step by step:
 *   1. subscribers subscribe: their keys go into a trie (reference counted:
 *      two subscribers of one key are one trie entry), and a forwarder
 *      computes the minimal diff to send to an upstream broker;
 *   2. a publisher's batch arrives as bytes (here built with an outbox, as
 *      a fastbus client builds it): it is validated and decoded in place;
 *   3. the batch's topics are routed in one call, and each record is
 *      appended to the outbox of every subscriber that wants it;
 *   4. the outboxes are flushed by policy (count, size, age) into batches
 *      that a subscriber decodes the same way;
 *   5. a subscriber disconnects: its keys leave the trie, and the forwarder
 *      says which unsubscribes to send upstream.
 *
 * Build against the standalone library (csrc/Makefile) and run:
 *   make -C csrc && cc -std=c11 -Icsrc examples/embed/route.c csrc/build/libfastbus.a -o route && ./route
 * or `make -C examples/embed run` (and `make -C examples/embed asan`).
 * It checks its own results: exit status 0 when every delivery is right.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FASTBUS_INSTALLED
#include <fastbus/fastbus.h>      /* after `make -C csrc install` */
#else
#include "fastbus.h"              /* -I csrc, or -I fastbus.get_include() of a wheel */
#endif

#define NSUB 3

static int failures;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);            \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
            failures++;                                                       \
        }                                                                     \
    } while (0)

/* Every core call returns a status; a broker must look at each one. */
static void ok(int rc, const char *what)
{
    if (rc < 0) {
        fprintf(stderr, "%s: %s\n", what, fb_strerror(rc));
        exit(2);
    }
}

static void print_diff(const char *why, const fb_keylist *diff)
{
    printf("upstream diff after %s:", why);
    if (diff->n == 0)
        printf(" (nothing)");
    for (size_t i = 0; i < diff->n; i++) {
        const fb_keyent *e = &diff->ents[i];
        printf(" %s%s'%.*s'", e->flags & FB_KL_SUBSCRIBE ? "+" : "-",
               e->flags & FB_KL_PREFIX ? "prefix " : "", (int)e->len,
               (const char *)fb_keylist_key(diff, i));
    }
    printf("\n");
}

struct sub {
    uint64_t id;
    const char *key;
    int kind;
    int expect;          /* records it should get from the batch below */
};

int main(void)
{
    static const struct sub subs[] = {
        {1, "orders.eu", FB_EXACT, 2},   /* exact channel */
        {2, "orders.", FB_PREFIX, 4},    /* a pattern "orders.*" */
        {3, "orders.eu", FB_EXACT, 2},   /* same key as subscriber 1: one upstream subscribe */
    };
    fb_trie *trie = fb_trie_new();
    fb_forwarder *fwd = fb_forwarder_new(FB_FWD_SUBSUME, 0, 0);
    if (!trie || !fwd) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    fb_keylist diff;
    fb_keylist_init(&diff);

    /* 1. subscriptions */
    for (size_t i = 0; i < NSUB; i++) {
        const struct sub *s = &subs[i];
        ok(fb_trie_add(trie, s->key, strlen(s->key), s->kind, s->id), "fb_trie_add");
        ok(fb_forwarder_subscribe(fwd, s->id, s->key, strlen(s->key), s->kind, &diff), "fb_forwarder_subscribe");
    }
    print_diff("3 subscriptions", &diff);
    /* subsume mode: "orders." covers "orders.eu", so in the end one prefix
     * key is upstream (subscribed before "orders.eu" is dropped: no gap) */
    CHECK(diff.n == 3 && fb_forwarder_upstream_count(fwd) == 1,
          "expected +orders.eu, +prefix orders., -orders.eu and one upstream key; got %zu entries, %zu upstream",
          diff.n, fb_forwarder_upstream_count(fwd));
    fb_keylist_clear(&diff);

    /* 2. a publisher's batch, as bytes on the wire */
    static const char *topics[] = {"orders.eu", "orders.us", "billing", "orders.eu", "orders.asia", "x"};
    enum { NREC = sizeof topics / sizeof topics[0] };
    fb_outbox pub;
    fb_outbox_limits plim = {.max_messages = 1000, .max_bytes = 1 << 20, .max_age_ns = 1000000, .checksum = 1};
    fb_outbox_init(&pub, &plim);
    uint64_t now = fb_now_ns();
    for (size_t i = 0; i < NREC; i++) {
        char payload[32];
        int n = snprintf(payload, sizeof payload, "payload %zu", i);
        ok(fb_outbox_append(&pub, topics[i], strlen(topics[i]), payload, (size_t)n, now), "fb_outbox_append");
    }
    unsigned char *wire;
    size_t wire_len;
    ok(fb_outbox_take(&pub, &wire, &wire_len), "fb_outbox_take");

    /* the broker's side: validate everything before trusting any length */
    fb_decode_limits dlim = {.max_topic = 1024, .max_payload = 1 << 20, .max_records = 10000, .require_checksum = 1};
    uint32_t count;
    uint8_t flags;
    ok(fb_batch_header(wire, wire_len, &count, &flags), "fb_batch_header");
    fb_record *recs = calloc(count ? count : 1, sizeof *recs);
    size_t nrec;
    ok(fb_batch_decode(wire, wire_len, &dlim, recs, count, &nrec), "fb_batch_decode");
    CHECK(nrec == NREC, "decoded %zu records, not %d", nrec, NREC);

    /* a corrupted copy is refused, not half-read */
    unsigned char *bad = malloc(wire_len);
    memcpy(bad, wire, wire_len);
    bad[wire_len / 2] ^= 0x5a;
    size_t nbad = 99;
    int rc = fb_batch_decode(bad, wire_len, &dlim, NULL, 0, &nbad);
    CHECK(rc < 0 && nbad == 0, "a corrupted batch decoded (%s)", fb_strerror(rc));
    free(bad);

    /* 3. route all topics in one call, then append to per-subscriber outboxes */
    fb_span *spans = calloc(nrec, sizeof *spans);
    size_t *offsets = calloc(nrec + 1, sizeof *offsets);
    for (size_t i = 0; i < nrec; i++)
        spans[i] = (fb_span){recs[i].topic, recs[i].topic_len};
    fb_idvec ids;
    fb_idvec_init(&ids);
    ok(fb_trie_match_batch(trie, spans, nrec, offsets, &ids), "fb_trie_match_batch");

    fb_outbox out[NSUB + 1];   /* indexed by subscriber id */
    fb_outbox_limits slim = {.max_messages = 64, .max_bytes = 64 * 1024, .max_age_ns = 2000000, .checksum = 0};
    for (size_t i = 0; i <= NSUB; i++)
        fb_outbox_init(&out[i], &slim);
    size_t unrouted = 0;
    for (size_t i = 0; i < nrec; i++) {
        if (offsets[i] == offsets[i + 1])
            unrouted++;
        for (size_t k = offsets[i]; k < offsets[i + 1]; k++)
            ok(fb_outbox_append(&out[ids.ids[k]], recs[i].topic, recs[i].topic_len,
                                recs[i].payload, recs[i].payload_len, now), "fb_outbox_append");
    }
    CHECK(unrouted == 2, "%zu records had no subscriber, expected 2 (billing, x)", unrouted);

    /* 4. flush by policy (here: the age limit, 2 ms later) and decode */
    uint64_t later = now + 3000000;
    for (size_t i = 0; i < NSUB; i++) {
        const struct sub *s = &subs[i];
        fb_outbox *o = &out[s->id];
        CHECK(fb_outbox_due(o, later), "subscriber %llu's outbox is not due after its max age",
              (unsigned long long)s->id);
        unsigned char *b;
        size_t blen;
        ok(fb_outbox_take(o, &b, &blen), "fb_outbox_take");
        fb_record got[NREC];
        size_t n = 0;
        ok(fb_batch_decode(b, blen, NULL, got, NREC, &n), "fb_batch_decode");
        printf("subscriber %llu (%s '%s'): %zu records:", (unsigned long long)s->id,
               s->kind == FB_PREFIX ? "prefix" : "exact", s->key, n);
        for (size_t r = 0; r < n; r++)
            printf(" [%.*s: %.*s]", (int)got[r].topic_len, (const char *)got[r].topic,
                   (int)got[r].payload_len, (const char *)got[r].payload);
        printf("\n");
        CHECK((int)n == s->expect, "subscriber %llu got %zu records, expected %d",
              (unsigned long long)s->id, n, s->expect);
        fb_free(b);
    }

    /* 5. subscriber 2 (the prefix) disconnects */
    fb_keylist gone;
    fb_keylist_init(&gone);
    ok(fb_trie_remove_subscriber(trie, 2, &gone), "fb_trie_remove_subscriber");
    ok(fb_forwarder_remove_peer(fwd, 2, &diff), "fb_forwarder_remove_peer");
    print_diff("subscriber 2 left", &diff);
    CHECK(gone.n == 1, "subscriber 2 held %zu keys, expected 1", gone.n);
    CHECK(fb_trie_any_match(trie, "orders.eu", 9) == 1 && fb_trie_any_match(trie, "orders.us", 9) == 0,
          "after the disconnect orders.eu should still be wanted and orders.us not");
    CHECK(fb_trie_check(trie, NULL) == 0, "trie invariants broken");

    fb_keylist_free(&gone);
    for (size_t i = 0; i <= NSUB; i++)
        fb_outbox_destroy(&out[i]);
    fb_outbox_destroy(&pub);
    fb_idvec_free(&ids);
    free(offsets);
    free(spans);
    free(recs);
    fb_free(wire);
    fb_keylist_free(&diff);
    fb_forwarder_free(fwd);
    fb_trie_free(trie);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("ok: every record reached exactly the subscribers that wanted it\n");
    return 0;
}
