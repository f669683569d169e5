/*
 * fb_forwarder.h - diff-only subscription forwarding.
 *
 * A broker (or any XPUB-like node) receives subscribe/unsubscribe events from
 * its downstream peers and must keep its own upstream subscription set such
 * that, for every topic, upstream matches exactly when some downstream key
 * matches.  The forwarder turns each event into the minimal ordered list of
 * upstream operations that keeps that true ("the diff").
 *
 * Modes:
 *   FB_FWD_DEDUP    as ZeroMQ's XPUB: forward a (key, kind) when it gets its
 *                   first downstream holder, unforward when the last goes.
 *   FB_FWD_SUBSUME  additionally, a key covered by a held PREFIX key (the exact
 *                   key "ab" or the prefix "abc" under the prefix "ab") is not
 *                   forwarded.  When the cover goes, the keys it hid are
 *                   subscribed BEFORE the cover is unsubscribed, so applying
 *                   the diff in order never filters out a wanted message.
 *
 * Cap: with cap > 0, when more than `cap` keys would be upstream the set
 * collapses to the single prefix "" (subscribe-everything); it expands back
 * when the count falls to `cap_low` or below (hysteresis, so a set hovering at
 * the cap does not flap).  Both transitions keep the ordering guarantee:
 * subscribe "" before the unsubscribes, subscribe the keys before
 * unsubscribing "".
 *
 * Every call appends its diff to a caller's fb_keylist: entries with
 * FB_KL_SUBSCRIBE set or not, FB_KL_PREFIX for prefix keys.  On error nothing
 * is appended and the state is unchanged (FB_ENOMEM in the middle of
 * remove_peer: see below).
 */
#ifndef FB_FORWARDER_H
#define FB_FORWARDER_H

#include "fb_common.h"
#include "fb_trie.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FB_FWD_DEDUP = 0, FB_FWD_SUBSUME = 1 } fb_forwarder_mode;

typedef struct fb_forwarder fb_forwarder;

/* cap = 0: no cap.  cap_low must be <= cap (0 < cap: 0 <= cap_low <= cap);
 * NULL on a bad argument or out of memory. */
fb_forwarder *fb_forwarder_new(fb_forwarder_mode mode, size_t cap, size_t cap_low);
/* The same over a table the caller owns (and must outlive the forwarder),
 * such as the trie a broker routes with: the forwarder's calls are then
 * that table's changes, so each key is stored once, not once for routing
 * and again for the diffs.  Nobody else may change the table meanwhile (its
 * readers, routing, may look: the caller serialises them with its lock). */
fb_forwarder *fb_forwarder_new_over(fb_trie *t, fb_forwarder_mode mode, size_t cap, size_t cap_low);
void fb_forwarder_free(fb_forwarder *f);

/* A downstream peer subscribes / unsubscribes (reference counted per peer).
 * Return 1 when the (key, kind) got its first / lost its last downstream
 * holder (only then can the diff be non-empty), 0 otherwise, < 0 on error. */
int fb_forwarder_subscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                     fb_keylist *diff);
/* FB_ENOTFOUND if the peer does not hold the key. */
int fb_forwarder_unsubscribe(fb_forwarder *f, uint64_t peer, const void *key, size_t len, int kind,
                       fb_keylist *diff);
/* The peer went away: drop everything it held.  Returns the number of keys it
 * held.  Keys are released longest first, so the diff is minimal.  On
 * FB_ENOMEM the diff so far is appended and the peer partly removed; calling
 * again continues. */
int fb_forwarder_remove_peer(fb_forwarder *f, uint64_t peer, fb_keylist *diff);

/* The same, a part at a time: releases about max_bytes (> 0) of the peer's
 * keys, longest first among them, so that a caller can send each part's
 * diff before the next is built.  A peer leaving with many long keys then
 * costs one part beside its keys, not a copy of them, a diff as large and
 * the frames made of it.  Each part's diff is minimal for that part: a
 * prefix of the peer that goes in an earlier part than keys of the peer
 * below it uncovers them (subscribed, to be unsubscribed in their part),
 * an op or two more, in the same safe order.  Returns 1 when keys went
 * (call again: there may be more), 0 when the peer holds nothing (the
 * diff is then empty), < 0 on error (the part partly removed; calling
 * again continues).  Other events may come between the parts. */
int fb_forwarder_remove_peer_some(fb_forwarder *f, uint64_t peer, fb_keylist *diff, size_t max_bytes);

/* The peer went away, and the caller sends the whole upstream set next
 * (fb_forwarder_snapshot) instead of a diff: drop everything it held
 * without building one.  No copy of its keys is made, which matters when
 * they are many and long and the set left is small (a diff would be as
 * large as the keys it names).  Returns the number of keys it held; on
 * FB_ENOMEM the peer is partly removed and calling again continues. */
int fb_forwarder_drop_peer(fb_forwarder *f, uint64_t peer);

/* The full upstream set as subscribe operations, to send after a reconnect. */
int fb_forwarder_snapshot(const fb_forwarder *f, fb_keylist *out);

/* Number of keys upstream would hold uncollapsed (dedup: distinct keys). */
size_t fb_forwarder_upstream_count(const fb_forwarder *f);
/* 1 while collapsed to the "" prefix by the cap. */
int fb_forwarder_collapsed(const fb_forwarder *f);
fb_forwarder_mode fb_forwarder_get_mode(const fb_forwarder *f);
/* The downstream table (read-only): peers are its subscribers. */
const fb_trie *fb_forwarder_trie(const fb_forwarder *f);

#ifdef __cplusplus
}
#endif
#endif /* FB_FORWARDER_H */
