/*
 * fb_journal.h - an append-only journal in segment files, written in
 * group commits, that a process killed at any moment reads back up to its
 * last whole commit.
 *
 * The broker's --journal (docs/PROTOCOL.md, "The journal"): what a
 * session is owed, and what describes the session, is appended as
 * records; a commit writes everything appended since the last one with
 * one write(2), and only then may the broker say it took what those
 * records hold.  Records are opaque here: a type byte and a payload.
 *
 * On disk, DIR/<16 hex digits>.fbj, numbered in order; each starts with
 * the 8 bytes "FBJOURN1", then records:
 *
 *     len u32 LE | crc u32 LE | type u8 | payload (len bytes)
 *
 * crc is CRC32C of the type byte and the payload.  Each commit ends with
 * a record of type FB_JOURNAL_COMMIT (empty payload).  A reader takes a
 * segment's records up to its last whole commit: a torn tail (a write
 * cut by kill -9 or a full disk, a bad crc) ends it there, and what
 * follows is not read.  A journal opened for writing never appends to an
 * existing segment: it starts the next one.
 *
 * Durability, as Redis's appendfsync: FB_JOURNAL_FSYNC_ALWAYS syncs
 * (fdatasync) in every commit, before it returns; FB_JOURNAL_FSYNC_EVERYSEC
 * has a thread of its own sync what was written, once a second (a kill -9
 * loses nothing written; a power cut up to a second); FB_JOURNAL_FSYNC_NO
 * leaves it to the kernel.
 *
 * Not thread-safe: one writer (the broker's relay thread).  The
 * everysec thread shares only the descriptor, under the journal's mutex.
 */
#ifndef FB_JOURNAL_H
#define FB_JOURNAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FB_JOURNAL_MAGIC "FBJOURN1"
#define FB_JOURNAL_MAGIC_LEN 8
/* A record's header: len, crc, type. */
#define FB_JOURNAL_HEADER 9
/* The end of a commit (written by fb_journal_commit). */
#define FB_JOURNAL_COMMIT 0
/* The largest payload of one record (a batch is at most 64 MiB). */
#define FB_JOURNAL_MAX_RECORD (65u * 1024 * 1024)

enum { FB_JOURNAL_FSYNC_NO = 0, FB_JOURNAL_FSYNC_EVERYSEC = 1, FB_JOURNAL_FSYNC_ALWAYS = 2 };

typedef struct fb_journal_stats {
    uint64_t commits;            /* commits written */
    uint64_t bytes_written;      /* bytes written, all segments */
    uint64_t fsyncs;             /* syncs done (either thread) */
    uint64_t fsync_ns;           /* time they took, in all */
    uint64_t fsync_max_ns;       /* the longest */
    uint64_t write_errors;       /* commits that could not be written (then retried) */
    uint64_t dropped_bytes;      /* appended bytes given up after failing writes (past max_pending) */
    uint64_t segment;            /* the number of the segment written now */
} fb_journal_stats;

typedef struct fb_journal fb_journal;

/* Open DIR (created if missing) for writing: the next segment after the
 * last there.  segment_bytes: a commit that leaves a segment this large
 * starts the next one.  max_pending: what appended records may hold while
 * writes fail (a full disk); past it they are dropped, counted.  NULL with
 * errno on failure (the directory cannot be made or written). */
fb_journal *fb_journal_open(const char *dir, int fsync_mode, uint64_t segment_bytes, size_t max_pending);
void fb_journal_close(fb_journal *j);

/* Append a record (to memory: nothing is written before the commit).
 * 0, or -1 with errno (EINVAL: payload too large; ENOMEM). */
int fb_journal_append(fb_journal *j, uint8_t type, const void *payload, size_t len);
/* The same, the payload in two parts (a header and a batch, say). */
int fb_journal_append2(fb_journal *j, uint8_t type, const void *a, size_t alen, const void *b, size_t blen);

/* Bytes appended since the last commit (0: nothing to commit). */
size_t fb_journal_pending(const fb_journal *j);

/* Write what was appended (and a COMMIT record) with one write, synced
 * under FSYNC_ALWAYS; a segment that grew past segment_bytes is followed
 * by a new one (roll: also at once).  0 when it is written; -1 with errno
 * when not (it stays appended, tried again by the next commit, unless
 * more than max_pending is waiting: then it is dropped and counted in
 * dropped_bytes, and the return is -1 with errno ENOSPC or the write's).
 * A segment a failed write left partly written is cut back to its last
 * whole commit first. */
int fb_journal_commit(fb_journal *j, int roll);

/* Delete the segments numbered below `segment` (never the current one).
 * The number deleted. */
int fb_journal_drop_before(fb_journal *j, uint64_t segment);

/* Bytes of all segments on disk, and how many there are. */
uint64_t fb_journal_disk_bytes(const fb_journal *j, uint64_t *segments);
void fb_journal_get_stats(const fb_journal *j, fb_journal_stats *out);

/* Read DIR's segments in order, each up to its last whole commit:
 * fn(arg, segment, type, payload, len) for every record but the
 * commits; a nonzero return stops.  *torn_out (if not NULL): the bytes
 * past the last whole commit, over all segments (what a kill -9 or a
 * full disk cut off).  0, or -1 with errno (the directory cannot be
 * read; a missing one is empty: 0). */
typedef int (*fb_journal_record_fn)(void *arg, uint64_t segment, uint8_t type, const unsigned char *payload,
                                    size_t len);
int fb_journal_read(const char *dir, fb_journal_record_fn fn, void *arg, uint64_t *torn_out);

#ifdef __cplusplus
}
#endif
#endif
