/*
 * fb_view.c - a publisher's view of what subscribers want (fb_view.h).
 */
#include "fb_view.h"

#include <stdlib.h>

#include "fb_batch.h"

void fb_view_init(fb_view *v)
{
    v->lock.held = 0;
    v->trie = NULL;
    v->on = 0;
    v->applied = v->acked = v->ack_until_ns = v->wants = 0;
    v->lease_until_ns = v->renew_at_ns = UINT64_MAX;
    v->renew = FB_VIEW_RENEW_NONE;
    v->leases = 0;
}

void fb_view_free(fb_view *v)
{
    fb_trie_free(v->trie);
    v->trie = NULL;
    v->on = 0;
}

/* Decode and check an ops batch: *recs (malloc'd, NULL when empty), *n. */
static int decode_ops(const void *ops, size_t len, fb_record **recs, size_t *n)
{
    uint32_t count;
    uint8_t bflags;
    *recs = NULL;
    *n = 0;
    int rc = fb_batch_header(ops, len, &count, &bflags);
    if (rc < 0) return rc;
    /* A record takes at least 3 bytes (two one-byte lengths, one flags
     * byte): a count the frame cannot hold is refused before it sizes an
     * allocation. */
    if (count > len / 3) return FB_EMALFORMED;
    if (count == 0) return fb_batch_decode(ops, len, NULL, NULL, 0, n);
    fb_record *r = malloc((size_t)count * sizeof *r);
    if (!r) return FB_ENOMEM;
    fb_decode_limits lim = {0, 1, count, 0};
    rc = fb_batch_decode(ops, len, &lim, r, count, n);
    for (size_t i = 0; rc == FB_OK && i < *n; i++)
        if (r[i].payload_len != 1 || (r[i].payload[0] & ~(FB_OP_F_SUBSCRIBE | FB_OP_F_PREFIX)))
            rc = FB_EMALFORMED;
    if (rc < 0) {
        free(r);
        *n = 0;
        return rc;
    }
    *recs = r;
    return FB_OK;
}

static int kind_of(const fb_record *r)
{
    return (r->payload[0] & FB_OP_F_PREFIX) ? FB_PREFIX : FB_EXACT;
}

int fb_view_apply(fb_view *v, unsigned flags, const void *ops, size_t len, int has_seq, uint64_t seq,
                  uint64_t now_ns, uint64_t *ack)
{
    fb_record *recs;
    size_t n;
    *ack = 0;
    int rc = decode_ops(ops, len, &recs, &n);
    if (rc < 0) return rc;
    fb_trie *fresh = NULL, *old = NULL;
    if (flags & FB_WANT_RESET) {
        /* A snapshot is built outside the lock (it may hold many keys),
         * then swapped in. */
        fresh = fb_trie_new();
        for (size_t i = 0; fresh && i < n; i++)
            if ((recs[i].payload[0] & FB_OP_F_SUBSCRIBE) &&
                fb_trie_add(fresh, recs[i].topic, recs[i].topic_len, kind_of(&recs[i]), 0) < 0) {
                fb_trie_free(fresh);
                fresh = NULL;
            }
        if (!fresh) rc = FB_ENOMEM;
    }
    fb_lock_wait(&v->lock);
    if (flags & FB_WANT_RESET) {
        old = v->trie;
        v->trie = fresh;
        v->on = fresh != NULL;
    } else if (v->on) {
        for (size_t i = 0; i < n; i++) {
            const fb_record *r = &recs[i];
            if (r->payload[0] & FB_OP_F_SUBSCRIBE) {
                if (fb_trie_add(v->trie, r->topic, r->topic_len, kind_of(r), 0) == FB_ENOMEM) {
                    v->on = 0;          /* an incomplete view would drop wanted messages */
                    rc = FB_ENOMEM;
                    break;
                }
            } else {
                (void)fb_trie_remove(v->trie, r->topic, r->topic_len, kind_of(r), 0);
            }
        }
    }
    v->wants++;
    if (has_seq) {
        v->applied = seq;
        if (now_ns < v->ack_until_ns) *ack = seq;
    }
    fb_lock_release(&v->lock);
    fb_trie_free(old);
    free(recs);
    return rc;
}

void fb_view_acked(fb_view *v, uint64_t seq)
{
    fb_lock_wait(&v->lock);
    if (seq > v->acked) v->acked = seq;
    fb_lock_release(&v->lock);
}

uint64_t fb_view_grant(fb_view *v, uint64_t ack_until_ns)
{
    fb_lock_wait(&v->lock);
    if (ack_until_ns > v->ack_until_ns) v->ack_until_ns = ack_until_ns;
    uint64_t ack = v->applied > v->acked ? v->applied : 0;
    fb_lock_release(&v->lock);
    return ack;
}

void fb_view_forget(fb_view *v)
{
    fb_lock_wait(&v->lock);
    fb_trie *old = v->trie;
    v->trie = NULL;
    v->on = 0;
    v->applied = v->acked = 0;
    __atomic_store_n(&v->lease_until_ns, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&v->renew, FB_VIEW_RENEW_NONE, __ATOMIC_SEQ_CST);
    fb_lock_release(&v->lock);
    fb_trie_free(old);
}

int fb_view_in_lease(fb_view *v, uint64_t now_ns)
{
    return now_ns < __atomic_load_n(&v->lease_until_ns, __ATOMIC_SEQ_CST);
}

int fb_view_ask_renewal(fb_view *v, uint64_t now_ns, int force)
{
    if (!force && now_ns < __atomic_load_n(&v->renew_at_ns, __ATOMIC_SEQ_CST)) return 0;
    int none = FB_VIEW_RENEW_NONE;
    return __atomic_compare_exchange_n(&v->renew, &none, FB_VIEW_RENEW_WANTED, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

int fb_view_take_renewal(fb_view *v)
{
    int wanted = FB_VIEW_RENEW_WANTED;
    return __atomic_compare_exchange_n(&v->renew, &wanted, FB_VIEW_RENEW_SENT, 0, __ATOMIC_SEQ_CST,
                                       __ATOMIC_SEQ_CST);
}

void fb_view_renewal_unsent(fb_view *v)
{
    int sent = FB_VIEW_RENEW_SENT;
    __atomic_compare_exchange_n(&v->renew, &sent, FB_VIEW_RENEW_WANTED, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

uint64_t fb_view_lease(fb_view *v, uint64_t sent_ns, uint64_t lease_us)
{
    if (lease_us > FB_VIEW_LEASE_MAX_US) lease_us = FB_VIEW_LEASE_MAX_US;
    uint64_t usable = lease_us * FB_VIEW_LEASE_USE_PERMILLE;       /* ns: µs x 1000 x permille / 1000 */
    fb_lock_wait(&v->lock);
    uint64_t until = __atomic_load_n(&v->lease_until_ns, __ATOMIC_SEQ_CST);
    if (usable && sent_ns + usable > until) {
        /* (The renewal is due at half the usable lease: a filter in use
         * never runs out while pings come back within the other half.) */
        __atomic_store_n(&v->renew_at_ns, sent_ns + usable / 2, __ATOMIC_SEQ_CST);
        __atomic_store_n(&v->lease_until_ns, sent_ns + usable, __ATOMIC_SEQ_CST);
    }
    __atomic_store_n(&v->renew, FB_VIEW_RENEW_NONE, __ATOMIC_SEQ_CST);
    v->leases++;
    fb_lock_release(&v->lock);
    return fb_view_grant(v, sent_ns + 2 * lease_us * 1000);
}

void fb_view_renewal_answered(fb_view *v)
{
    __atomic_store_n(&v->renew, FB_VIEW_RENEW_NONE, __ATOMIC_SEQ_CST);
}

void fb_view_set_lease(fb_view *v, uint64_t until_ns)
{
    fb_lock_wait(&v->lock);
    __atomic_store_n(&v->lease_until_ns, until_ns, __ATOMIC_SEQ_CST);
    if (until_ns == UINT64_MAX) __atomic_store_n(&v->renew_at_ns, UINT64_MAX, __ATOMIC_SEQ_CST);
    __atomic_store_n(&v->renew, FB_VIEW_RENEW_NONE, __ATOMIC_SEQ_CST);
    fb_lock_release(&v->lock);
}

int fb_view_match(fb_view *v, const void *topic, size_t len)
{
    fb_lock_wait(&v->lock);
    int rc = v->on ? fb_trie_any_match(v->trie, topic, len) > 0 : -1;
    fb_lock_release(&v->lock);
    return rc;
}

int fb_view_match_lease(fb_view *v, const void *topic, size_t len, uint64_t *until_ns)
{
    fb_lock_wait(&v->lock);
    int rc = v->on ? fb_trie_any_match(v->trie, topic, len) > 0 : -1;
    *until_ns = __atomic_load_n(&v->lease_until_ns, __ATOMIC_SEQ_CST);
    fb_lock_release(&v->lock);
    return rc;
}
