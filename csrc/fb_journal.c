/* fb_journal.c - see fb_journal.h. */
#define _GNU_SOURCE
#include "fb_journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fb_batch.h"                    /* fb_crc32c */
#include "fb_common.h"

/* A segment on disk: its number and size (the writer's list of them). */
typedef struct seg {
    uint64_t num;
    uint64_t bytes;
} seg;

struct fb_journal {
    char dir[PATH_MAX];
    int fsync_mode;
    uint64_t segment_bytes;
    size_t max_pending;

    /* What was appended since the last commit. */
    unsigned char *buf;
    size_t len, cap;

    /* The segment written now, and those before it still on disk. */
    int fd;
    uint64_t num;
    uint64_t size;               /* bytes in it: everything up to its last whole commit */
    seg *segs;                   /* the older ones, oldest first */
    size_t nsegs, segs_cap;
    fb_journal_stats st;

    /* FSYNC_EVERYSEC: the syncing thread.  `mu` guards fd, dirty, stop. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t syncer;
    int syncing, dirty, stop;
};

static void put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void seg_path(char *out, size_t n, const char *dir, uint64_t num)
{
    snprintf(out, n, "%s/%016llx.fbj", dir, (unsigned long long)num);
}

/* A segment file's number from its name, or -1. */
static int parse_name(const char *name, uint64_t *num)
{
    size_t n = strlen(name);
    if (n != 20 || strcmp(name + 16, ".fbj") != 0) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *num = v;
    return 0;
}

static int cmp_seg(const void *a, const void *b)
{
    uint64_t x = ((const seg *)a)->num, y = ((const seg *)b)->num;
    return x < y ? -1 : x > y;
}

/* DIR's segments, sorted: *out (malloc'd), *n.  -1 with errno. */
static int list_segments(const char *dir, seg **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -1;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        uint64_t num;
        if (parse_name(e->d_name, &num) < 0) continue;
        if (*n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            seg *p = realloc(*out, nc * sizeof *p);
            if (!p) {
                closedir(d);
                free(*out);
                *out = NULL;
                errno = ENOMEM;
                return -1;
            }
            *out = p;
            cap = nc;
        }
        char path[PATH_MAX + 32];
        struct stat sb;
        seg_path(path, sizeof path, dir, num);
        (*out)[*n].num = num;
        (*out)[*n].bytes = stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        (*n)++;
    }
    closedir(d);
    if (*n) qsort(*out, *n, sizeof **out, cmp_seg);
    return 0;
}

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void sync_fd(fb_journal *j, int fd)
{
    uint64_t t0 = fb_now_ns();
    fdatasync(fd);
    uint64_t dt = fb_now_ns() - t0;
    __atomic_add_fetch(&j->st.fsyncs, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&j->st.fsync_ns, dt, __ATOMIC_RELAXED);
    if (dt > __atomic_load_n(&j->st.fsync_max_ns, __ATOMIC_RELAXED))
        __atomic_store_n(&j->st.fsync_max_ns, dt, __ATOMIC_RELAXED);
}

/* FSYNC_EVERYSEC: sync what was written, once a second, off the writer's
 * thread (its commits never wait for the disk). */
static void *syncer_main(void *arg)
{
    fb_journal *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->dirty && j->fd >= 0) {
            j->dirty = 0;
            int fd = dup(j->fd);             /* (a roll may close j->fd meanwhile) */
            pthread_mutex_unlock(&j->mu);
            if (fd >= 0) {
                sync_fd(j, fd);
                close(fd);
            }
            pthread_mutex_lock(&j->mu);
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

/* Start segment `num`: created, its magic written. */
static int start_segment(fb_journal *j, uint64_t num)
{
    char path[PATH_MAX + 32];
    seg_path(path, sizeof path, j->dir, num);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (write_all(fd, (const unsigned char *)FB_JOURNAL_MAGIC, FB_JOURNAL_MAGIC_LEN) < 0) {
        int e = errno;
        close(fd);
        unlink(path);
        errno = e;
        return -1;
    }
    if (j->fsync_mode != FB_JOURNAL_FSYNC_NO) {
        /* The new file's name is in its directory: synced once, here. */
        sync_fd(j, fd);
        int dfd = open(j->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
    }
    pthread_mutex_lock(&j->mu);
    int old = j->fd;
    j->fd = fd;
    j->dirty = 0;
    pthread_mutex_unlock(&j->mu);
    if (old >= 0) {
        if (j->fsync_mode != FB_JOURNAL_FSYNC_NO) sync_fd(j, old);   /* all of the old one, before it is left */
        close(old);
        if (j->nsegs == j->segs_cap) {
            size_t nc = j->segs_cap ? j->segs_cap * 2 : 16;
            seg *p = realloc(j->segs, nc * sizeof *p);
            if (p) {
                j->segs = p;
                j->segs_cap = nc;
            }
        }
        if (j->nsegs < j->segs_cap) {
            j->segs[j->nsegs].num = j->num;
            j->segs[j->nsegs].bytes = j->size;
            j->nsegs++;
        }
    }
    j->num = num;
    j->size = FB_JOURNAL_MAGIC_LEN;
    j->st.segment = num;
    return 0;
}

fb_journal *fb_journal_open(const char *dir, int fsync_mode, uint64_t segment_bytes, size_t max_pending)
{
    if (!dir || strlen(dir) >= PATH_MAX - 32 || fsync_mode < FB_JOURNAL_FSYNC_NO ||
        fsync_mode > FB_JOURNAL_FSYNC_ALWAYS) {
        errno = EINVAL;
        return NULL;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) return NULL;
    fb_journal *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    snprintf(j->dir, sizeof j->dir, "%s", dir);
    j->fsync_mode = fsync_mode;
    j->segment_bytes = segment_bytes ? segment_bytes : 64u << 20;
    j->max_pending = max_pending ? max_pending : 256u << 20;
    j->fd = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    seg *old;
    size_t n;
    if (list_segments(dir, &old, &n) < 0) goto fail;
    uint64_t next = n ? old[n - 1].num + 1 : 0;
    j->segs = old;
    j->nsegs = j->segs_cap = n;
    if (start_segment(j, next) < 0) goto fail;
    if (fsync_mode == FB_JOURNAL_FSYNC_EVERYSEC) {
        if (pthread_create(&j->syncer, NULL, syncer_main, j) != 0) {
            errno = EAGAIN;
            goto fail;
        }
        j->syncing = 1;
    }
    return j;
fail:;
    int e = errno;
    if (j->fd >= 0) close(j->fd);
    free(j->segs);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
    errno = e;
    return NULL;
}

void fb_journal_close(fb_journal *j)
{
    if (!j) return;
    if (j->syncing) {
        pthread_mutex_lock(&j->mu);
        j->stop = 1;
        pthread_cond_signal(&j->cv);
        pthread_mutex_unlock(&j->mu);
        pthread_join(j->syncer, NULL);
    }
    if (j->fd >= 0) {
        if (j->fsync_mode != FB_JOURNAL_FSYNC_NO) sync_fd(j, j->fd);
        close(j->fd);
    }
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j->buf);
    free(j->segs);
    free(j);
}

static int reserve(fb_journal *j, size_t more)
{
    if (j->len + more <= j->cap) return 0;
    size_t nc = j->cap ? j->cap : 65536;
    while (nc < j->len + more) nc *= 2;
    unsigned char *p = realloc(j->buf, nc);
    if (!p) {
        errno = ENOMEM;
        return -1;
    }
    j->buf = p;
    j->cap = nc;
    return 0;
}

int fb_journal_append2(fb_journal *j, uint8_t type, const void *a, size_t alen, const void *b, size_t blen)
{
    if (!j || alen > FB_JOURNAL_MAX_RECORD || blen > FB_JOURNAL_MAX_RECORD - alen || (alen && !a) ||
        (blen && !b)) {
        errno = EINVAL;
        return -1;
    }
    if (reserve(j, FB_JOURNAL_HEADER + alen + blen) < 0) return -1;
    unsigned char *h = j->buf + j->len;
    put_u32(h, (uint32_t)(alen + blen));
    h[8] = type;
    if (alen) memcpy(h + FB_JOURNAL_HEADER, a, alen);
    if (blen) memcpy(h + FB_JOURNAL_HEADER + alen, b, blen);
    put_u32(h + 4, fb_crc32c(0, h + 8, 1 + alen + blen));
    j->len += FB_JOURNAL_HEADER + alen + blen;
    return 0;
}

int fb_journal_append(fb_journal *j, uint8_t type, const void *payload, size_t len)
{
    return fb_journal_append2(j, type, payload, len, NULL, 0);
}

size_t fb_journal_pending(const fb_journal *j)
{
    return j ? j->len : 0;
}

int fb_journal_commit(fb_journal *j, int roll)
{
    if (!j) {
        errno = EINVAL;
        return -1;
    }
    if (j->len == 0 && !roll) return 0;
    if (j->len) {
        if (fb_journal_append(j, FB_JOURNAL_COMMIT, NULL, 0) < 0) return -1;
        if (write_all(j->fd, j->buf, j->len) < 0) {
            int e = errno;
            j->st.write_errors++;
            /* What was written of it is cut off (a reader would stop at
             * it, and at everything committed after it).  The COMMIT goes
             * too: the next commit ends with its own. */
            if (ftruncate(j->fd, (off_t)j->size) == 0) lseek(j->fd, (off_t)j->size, SEEK_SET);
            j->len -= FB_JOURNAL_HEADER;
            if (j->len > j->max_pending) {
                j->st.dropped_bytes += j->len;
                j->len = 0;
            }
            errno = e;
            return -1;
        }
        j->size += j->len;
        j->st.bytes_written += j->len;
        j->st.commits++;
        j->len = 0;
        if (j->fsync_mode == FB_JOURNAL_FSYNC_ALWAYS) {
            sync_fd(j, j->fd);
        } else if (j->fsync_mode == FB_JOURNAL_FSYNC_EVERYSEC) {
            pthread_mutex_lock(&j->mu);
            j->dirty = 1;
            pthread_mutex_unlock(&j->mu);
        }
    }
    if (roll || j->size >= j->segment_bytes) {
        if (start_segment(j, j->num + 1) < 0) return -1;
    }
    return 0;
}

int fb_journal_drop_before(fb_journal *j, uint64_t segment)
{
    if (!j) return 0;
    int n = 0;
    size_t keep = 0;
    for (size_t i = 0; i < j->nsegs; i++) {
        if (j->segs[i].num < segment && j->segs[i].num != j->num) {
            char path[PATH_MAX + 32];
            seg_path(path, sizeof path, j->dir, j->segs[i].num);
            if (unlink(path) == 0 || errno == ENOENT) {
                n++;
                continue;
            }
        }
        j->segs[keep++] = j->segs[i];
    }
    j->nsegs = keep;
    return n;
}

uint64_t fb_journal_disk_bytes(const fb_journal *j, uint64_t *segments)
{
    if (!j) {
        if (segments) *segments = 0;
        return 0;
    }
    uint64_t total = j->size;
    for (size_t i = 0; i < j->nsegs; i++) total += j->segs[i].bytes;
    if (segments) *segments = j->nsegs + 1;
    return total;
}

void fb_journal_get_stats(const fb_journal *j, fb_journal_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!j) return;
    out->commits = j->st.commits;
    out->bytes_written = j->st.bytes_written;
    out->fsyncs = __atomic_load_n(&j->st.fsyncs, __ATOMIC_RELAXED);
    out->fsync_ns = __atomic_load_n(&j->st.fsync_ns, __ATOMIC_RELAXED);
    out->fsync_max_ns = __atomic_load_n(&j->st.fsync_max_ns, __ATOMIC_RELAXED);
    out->write_errors = j->st.write_errors;
    out->dropped_bytes = j->st.dropped_bytes;
    out->segment = j->num;
}

/* -- reading ----------------------------------------------------------------- */

/* A whole file into memory: *out (malloc'd), *n.  -1 with errno. */
static int slurp(const char *path, unsigned char **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return -1;
    }
    size_t size = (size_t)sb.st_size;
    unsigned char *p = malloc(size ? size : 1);
    if (!p) {
        close(fd);
        errno = ENOMEM;
        return -1;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, p + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    *out = p;
    *n = got;
    return 0;
}

/* Where the last whole commit of a segment's bytes ends (0: none). */
static size_t last_commit_end(const unsigned char *p, size_t n)
{
    size_t at = FB_JOURNAL_MAGIC_LEN, end = 0;
    while (n - at >= FB_JOURNAL_HEADER) {
        uint32_t len = get_u32(p + at);
        if (len > FB_JOURNAL_MAX_RECORD || len > n - at - FB_JOURNAL_HEADER) break;
        if (fb_crc32c(0, p + at + 8, 1 + (size_t)len) != get_u32(p + at + 4)) break;
        at += FB_JOURNAL_HEADER + len;
        if (p[at - len - 1] == FB_JOURNAL_COMMIT && len == 0) end = at;
    }
    return end;
}

int fb_journal_read(const char *dir, fb_journal_record_fn fn, void *arg, uint64_t *torn_out)
{
    seg *segs;
    size_t nsegs;
    uint64_t torn = 0;
    if (torn_out) *torn_out = 0;
    if (list_segments(dir, &segs, &nsegs) < 0) return -1;
    int rc = 0;
    for (size_t i = 0; i < nsegs && rc == 0; i++) {
        char path[PATH_MAX + 32];
        seg_path(path, sizeof path, dir, segs[i].num);
        unsigned char *p;
        size_t n;
        if (slurp(path, &p, &n) < 0) {
            if (errno == ENOENT) continue;
            rc = -1;
            break;
        }
        if (n < FB_JOURNAL_MAGIC_LEN || memcmp(p, FB_JOURNAL_MAGIC, FB_JOURNAL_MAGIC_LEN) != 0) {
            torn += n;                       /* (a segment cut before its magic: nothing in it) */
            free(p);
            continue;
        }
        size_t end = last_commit_end(p, n);
        torn += n - (end ? end : FB_JOURNAL_MAGIC_LEN);
        size_t at = FB_JOURNAL_MAGIC_LEN;
        while (at < end) {
            uint32_t len = get_u32(p + at);
            uint8_t type = p[at + 8];
            if (type != FB_JOURNAL_COMMIT && fn(arg, segs[i].num, type, p + at + FB_JOURNAL_HEADER, len)) {
                rc = 1;
                break;
            }
            at += FB_JOURNAL_HEADER + len;
        }
        free(p);
    }
    free(segs);
    if (torn_out) *torn_out = torn;
    return rc < 0 ? -1 : 0;
}
