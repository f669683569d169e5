/* Unit tests for fb_journal: what a commit wrote is read back, in order;
 * a torn tail (a write cut short, garbage, a bad crc) ends a segment at
 * its last whole commit; segments roll and are dropped; the sync modes
 * sync. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctest.h"
#include "fb_journal.h"

static char dir[256];

static void fresh_dir(void)
{
    static int made;                    /* one directory a test, this process's own */
    snprintf(dir, sizeof dir, "/tmp/fbj-test-%d-%d", (int)getpid(), made++);
    REQUIRE(mkdir(dir, 0700) == 0);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    REQUIRE(system(cmd) == 0);
}

typedef struct seen {
    int n;
    uint8_t types[64];
    char payloads[64][32];
    uint64_t segments[64];
} seen;

static int collect(void *arg, uint64_t segment, uint8_t type, const unsigned char *payload, size_t len)
{
    seen *s = arg;
    if (s->n < 64) {
        s->types[s->n] = type;
        s->segments[s->n] = segment;
        snprintf(s->payloads[s->n], sizeof s->payloads[0], "%.*s", (int)len, (const char *)payload);
    }
    s->n++;
    return 0;
}

static void test_what_was_committed_is_read_back_in_order(void)
{
    fresh_dir();
    fb_journal *j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 0, 0);
    REQUIRE(j != NULL);
    CHECK_EQ(fb_journal_append(j, 'a', "one", 3), 0);
    CHECK_EQ(fb_journal_append2(j, 'b', "tw", 2, "o", 1), 0);
    CHECK(fb_journal_pending(j) > 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    CHECK_EQ(fb_journal_pending(j), 0);
    CHECK_EQ(fb_journal_append(j, 'c', "three", 5), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    CHECK_EQ(fb_journal_append(j, 'd', "never committed", 15), 0);   /* (appended only) */
    seen s = {0};
    uint64_t torn = 99;
    CHECK_EQ(fb_journal_read(dir, collect, &s, &torn), 0);
    CHECK_EQ(s.n, 3);
    CHECK(s.types[0] == 'a' && strcmp(s.payloads[0], "one") == 0);
    CHECK(s.types[1] == 'b' && strcmp(s.payloads[1], "two") == 0);
    CHECK(s.types[2] == 'c' && strcmp(s.payloads[2], "three") == 0);
    CHECK_EQ(torn, 0);
    fb_journal_stats st;
    fb_journal_get_stats(j, &st);
    CHECK_EQ(st.commits, 2);
    CHECK_EQ(st.fsyncs, 0);
    fb_journal_close(j);
    /* Opened again: a new segment after the last, nothing appended to the old. */
    j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 0, 0);
    REQUIRE(j != NULL);
    fb_journal_get_stats(j, &st);
    CHECK_EQ(st.segment, 1);
    CHECK_EQ(fb_journal_append(j, 'e', "four", 4), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    memset(&s, 0, sizeof s);
    CHECK_EQ(fb_journal_read(dir, collect, &s, NULL), 0);
    CHECK_EQ(s.n, 4);
    CHECK(s.types[3] == 'e' && s.segments[3] == 1 && s.segments[0] == 0);
    fb_journal_close(j);
    remove_dir();
}

static void append_garbage(const char *path, const void *bytes, size_t n)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, bytes, n) == (ssize_t)n);
    close(fd);
}

static void test_a_torn_tail_ends_the_segment_at_its_last_whole_commit(void)
{
    fresh_dir();
    fb_journal *j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 0, 0);
    REQUIRE(j != NULL);
    CHECK_EQ(fb_journal_append(j, 'a', "kept", 4), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    CHECK_EQ(fb_journal_append(j, 'b', "kept too", 8), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    fb_journal_close(j);
    char path[300];
    snprintf(path, sizeof path, "%s/%016x.fbj", dir, 0);
    struct stat sb;
    REQUIRE(stat(path, &sb) == 0);
    /* A record cut short (kill -9 in the middle of a write). */
    append_garbage(path, "\x20\x00\x00\x00\x11\x22\x33\x44" "c" "half", 13);
    seen s = {0};
    uint64_t torn = 0;
    CHECK_EQ(fb_journal_read(dir, collect, &s, &torn), 0);
    CHECK_EQ(s.n, 2);
    CHECK_EQ(torn, 13);
    /* A whole record whose commit never came: not read either. */
    REQUIRE(truncate(path, sb.st_size) == 0);
    j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 0, 0);    /* (segment 1) */
    REQUIRE(j != NULL);
    fb_journal_close(j);
    unsigned char rec[9 + 3] = {3, 0, 0, 0, 0, 0, 0, 0, 'x', 'a', 'b', 'c'};
    append_garbage(path, rec, sizeof rec);                  /* (a bad crc as well) */
    memset(&s, 0, sizeof s);
    CHECK_EQ(fb_journal_read(dir, collect, &s, &torn), 0);
    CHECK_EQ(s.n, 2);
    CHECK_EQ(torn, sizeof rec);
    /* Garbage in place of a segment's magic: nothing in it is read. */
    snprintf(path, sizeof path, "%s/%016x.fbj", dir, 1);
    append_garbage(path, "junk", 4);
    char bad[300];
    snprintf(bad, sizeof bad, "%s/%016x.fbj", dir, 7);
    append_garbage(bad, "NOTMAGIC and more", 17);
    memset(&s, 0, sizeof s);
    CHECK_EQ(fb_journal_read(dir, collect, &s, &torn), 0);
    CHECK_EQ(s.n, 2);
    CHECK_EQ(torn, sizeof rec + 4 + 17);
    remove_dir();
}

static void test_segments_roll_and_the_old_ones_are_dropped(void)
{
    fresh_dir();
    fb_journal *j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 80, 0);
    REQUIRE(j != NULL);
    char payload[64];
    memset(payload, 'p', sizeof payload);
    for (int i = 0; i < 5; i++) {
        CHECK_EQ(fb_journal_append(j, (uint8_t)('a' + i), payload, sizeof payload), 0);
        CHECK_EQ(fb_journal_commit(j, 0), 0);              /* each commit passes 80 bytes: rolls */
    }
    uint64_t segments = 0;
    uint64_t bytes = fb_journal_disk_bytes(j, &segments);
    CHECK_EQ(segments, 6);                                  /* five full, the new empty one */
    CHECK_EQ(bytes, 5 * (8 + 9 + 64 + 9) + 8);
    seen s = {0};
    CHECK_EQ(fb_journal_read(dir, collect, &s, NULL), 0);
    CHECK_EQ(s.n, 5);
    CHECK(s.segments[4] == 4 && s.types[4] == 'e');
    CHECK_EQ(fb_journal_drop_before(j, 3), 3);
    bytes = fb_journal_disk_bytes(j, &segments);
    CHECK_EQ(segments, 3);
    memset(&s, 0, sizeof s);
    CHECK_EQ(fb_journal_read(dir, collect, &s, NULL), 0);
    CHECK_EQ(s.n, 2);
    CHECK(s.types[0] == 'd' && s.types[1] == 'e');
    CHECK_EQ(fb_journal_drop_before(j, 100), 2);           /* never the current one */
    memset(&s, 0, sizeof s);
    CHECK_EQ(fb_journal_read(dir, collect, &s, NULL), 0);
    CHECK_EQ(s.n, 0);
    CHECK_EQ(fb_journal_commit(j, 1), 0);                   /* a roll with nothing to write */
    fb_journal_get_stats(j, &(fb_journal_stats){0});
    fb_journal_close(j);
    remove_dir();
}

static void test_the_sync_modes_sync(void)
{
    fresh_dir();
    fb_journal *j = fb_journal_open(dir, FB_JOURNAL_FSYNC_ALWAYS, 0, 0);
    REQUIRE(j != NULL);
    fb_journal_stats before, st;
    fb_journal_get_stats(j, &before);
    CHECK_EQ(fb_journal_append(j, 'a', "x", 1), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    fb_journal_get_stats(j, &st);
    CHECK_EQ(st.fsyncs, before.fsyncs + 1);                 /* before the commit returned */
    fb_journal_close(j);
    j = fb_journal_open(dir, FB_JOURNAL_FSYNC_EVERYSEC, 0, 0);
    REQUIRE(j != NULL);
    fb_journal_get_stats(j, &before);
    CHECK_EQ(fb_journal_append(j, 'b', "y", 1), 0);
    CHECK_EQ(fb_journal_commit(j, 0), 0);
    fb_journal_get_stats(j, &st);
    CHECK_EQ(st.fsyncs, before.fsyncs);                     /* not in the commit */
    for (int i = 0; i < 30 && st.fsyncs == before.fsyncs; i++) {
        usleep(100000);
        fb_journal_get_stats(j, &st);
    }
    CHECK_EQ(st.fsyncs, before.fsyncs + 1);                 /* by its thread, within a second or so */
    fb_journal_close(j);
    seen s = {0};
    CHECK_EQ(fb_journal_read(dir, collect, &s, NULL), 0);
    CHECK_EQ(s.n, 2);
    remove_dir();
}

static void test_bad_arguments_and_directories_are_refused(void)
{
    errno = 0;
    CHECK(fb_journal_open("/dev/null/journal", FB_JOURNAL_FSYNC_NO, 0, 0) == NULL);
    CHECK(errno == ENOTDIR || errno == ENOENT);
    CHECK(fb_journal_open("/tmp", 7, 0, 0) == NULL);
    fresh_dir();
    fb_journal *j = fb_journal_open(dir, FB_JOURNAL_FSYNC_NO, 0, 0);
    REQUIRE(j != NULL);
    errno = 0;
    CHECK_EQ(fb_journal_append(j, 'a', NULL, 5), -1);
    CHECK_EQ(errno, EINVAL);
    CHECK_EQ(fb_journal_append2(j, 'a', "x", FB_JOURNAL_MAX_RECORD, "y", 1), -1);
    CHECK_EQ(fb_journal_pending(j), 0);
    fb_journal_close(j);
    /* A directory that does not exist reads as empty. */
    seen s = {0};
    CHECK_EQ(fb_journal_read("/tmp/fbj-test-no-such-dir", collect, &s, NULL), 0);
    CHECK_EQ(s.n, 0);
    remove_dir();
}

int main(void)
{
    RUN(test_what_was_committed_is_read_back_in_order);
    RUN(test_a_torn_tail_ends_the_segment_at_its_last_whole_commit);
    RUN(test_segments_roll_and_the_old_ones_are_dropped);
    RUN(test_the_sync_modes_sync);
    RUN(test_bad_arguments_and_directories_are_refused);
    CTEST_END();
}
