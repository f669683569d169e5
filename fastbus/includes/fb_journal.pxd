# Mirrors csrc/fb_journal.h
from libc.stdint cimport uint8_t, uint64_t

cdef extern from "fb_journal.h" nogil:
    ctypedef struct fb_journal:
        pass

    ctypedef struct fb_journal_stats:
        uint64_t commits
        uint64_t bytes_written
        uint64_t fsyncs
        uint64_t fsync_ns
        uint64_t fsync_max_ns
        uint64_t write_errors
        uint64_t dropped_bytes
        uint64_t segment

    enum:
        FB_JOURNAL_FSYNC_NO
        FB_JOURNAL_FSYNC_EVERYSEC
        FB_JOURNAL_FSYNC_ALWAYS
        FB_JOURNAL_MAX_RECORD

    ctypedef int (*fb_journal_record_fn)(void *arg, uint64_t segment, uint8_t type, const unsigned char *payload,
                                         size_t len) noexcept

    fb_journal *fb_journal_open(const char *dir, int fsync_mode, uint64_t segment_bytes, size_t max_pending)
    void fb_journal_close(fb_journal *j)
    int fb_journal_append(fb_journal *j, uint8_t type, const void *payload, size_t len)
    int fb_journal_append2(fb_journal *j, uint8_t type, const void *a, size_t alen, const void *b, size_t blen)
    size_t fb_journal_pending(const fb_journal *j)
    int fb_journal_commit(fb_journal *j, int roll)
    int fb_journal_drop_before(fb_journal *j, uint64_t segment)
    uint64_t fb_journal_disk_bytes(const fb_journal *j, uint64_t *segments)
    void fb_journal_get_stats(const fb_journal *j, fb_journal_stats *out)
    int fb_journal_read(const char *dir, fb_journal_record_fn fn, void *arg, uint64_t *torn_out)
