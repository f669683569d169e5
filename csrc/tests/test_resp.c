/* Tests of RESP pipelines: the outbox in RESP mode (commands) and
 * fb_resp_scan (replies). */
#include "ctest.h"
#include "fb_outbox.h"
#include "fb_resp.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_encode_commands(void)
{
    fb_outbox o;
    fb_outbox_limits lim = { 3, 0, 0, 1 };          /* checksum is ignored in RESP mode */
    REQUIRE(fb_outbox_init_resp(&o, &lim, "PUBLISH") == FB_OK);
    CHECK_EQ(fb_outbox_append(&o, "news", 4, "hello", 5, 0), 0);
    CHECK_EQ(fb_outbox_append(&o, "", 0, "", 0, 0), 0);
    CHECK_EQ(fb_outbox_append(&o, "b", 1, "a\r\nb", 4, 0), 1);      /* due by count */
    unsigned char *b;
    size_t n;
    REQUIRE(fb_outbox_take(&o, &b, &n) == FB_OK);
    const char *want = "*3\r\n$7\r\nPUBLISH\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
                       "*3\r\n$7\r\nPUBLISH\r\n$0\r\n\r\n$0\r\n\r\n"
                       "*3\r\n$7\r\nPUBLISH\r\n$1\r\nb\r\n$4\r\na\r\nb\r\n";
    CHECK_EQ(n, strlen(want));
    CHECK(n == strlen(want) && memcmp(b, want, n) == 0);
    /* A pipeline of commands is itself RESP: three arrays. */
    fb_resp_tally t;
    CHECK_EQ(fb_resp_scan(b, n, SIZE_MAX, &t, NULL, 0), FB_OK);
    CHECK_EQ(t.replies, 3);
    CHECK_EQ(t.consumed, n);
    free(b);
    CHECK_EQ(fb_outbox_count(&o), 0);
    fb_outbox_destroy(&o);
}

static void test_verbs(void)
{
    fb_outbox o;
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, ""), FB_EINVAL);
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, NULL), FB_EINVAL);
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, "PUB LISH"), FB_EINVAL);
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, "X\r\n"), FB_EINVAL);
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, "ABCDEFGHIJKLMNOP"), FB_EINVAL);   /* 16 > max */
    CHECK_EQ(fb_outbox_init_resp(&o, NULL, "ABCDEFGHIJKLMNO"), FB_OK);
    fb_outbox_destroy(&o);
    REQUIRE(fb_outbox_init_resp(&o, NULL, "RPUSH") == FB_OK);
    CHECK_EQ(fb_outbox_append(&o, "q", 1, "x", 1, 0), 0);
    CHECK_EQ(fb_outbox_bytes(&o), strlen("*3\r\n$5\r\nRPUSH\r\n$1\r\nq\r\n$1\r\nx\r\n"));
    fb_outbox_destroy(&o);
}

static void test_big_payload_sizes(void)
{
    /* Lengths with many digits are written right. */
    fb_outbox o;
    REQUIRE(fb_outbox_init_resp(&o, NULL, "PUBLISH") == FB_OK);
    size_t big = 1234567;
    char *p = malloc(big);
    REQUIRE(p);
    memset(p, 'z', big);
    REQUIRE(fb_outbox_append(&o, "c", 1, p, big, 0) >= 0);
    unsigned char *b;
    size_t n;
    REQUIRE(fb_outbox_take(&o, &b, &n) == FB_OK);
    const char *head = "*3\r\n$7\r\nPUBLISH\r\n$1\r\nc\r\n$1234567\r\n";
    CHECK(memcmp(b, head, strlen(head)) == 0);
    CHECK_EQ(n, strlen(head) + big + 2);
    fb_resp_tally t;
    CHECK_EQ(fb_resp_scan(b, n, SIZE_MAX, &t, NULL, 0), FB_OK);
    CHECK_EQ(t.replies, 1);
    /* Cut anywhere: nothing consumed, no error. */
    CHECK_EQ(fb_resp_scan(b, n - 1, SIZE_MAX, &t, NULL, 0), FB_OK);
    CHECK_EQ(t.replies, 0);
    CHECK_EQ(t.consumed, 0);
    free(b);
    free(p);
    fb_outbox_destroy(&o);
}

static const char REPLIES[] =
    ":1\r\n"
    ":0\r\n"
    "-ERR wrong number of arguments\r\n"
    ":2\r\n"
    "+OK\r\n"
    "$5\r\nab\r\nc\r\n"               /* CRLF inside a bulk string */
    "$-1\r\n"
    "*-1\r\n"
    "*2\r\n*1\r\n:5\r\n$3\r\nxyz\r\n"  /* nested; its inner :5 is not top-level */
    "*0\r\n"
    "%1\r\n+k\r\n:9\r\n"               /* RESP3 map */
    "_\r\n,1.5\r\n#t\r\n(123\r\n=7\r\ntxt:abc\r\n"
    "!3\r\nBAD\r\n"                    /* RESP3 bulk error */
    ":-4\r\n";

static void test_scan(void)
{
    size_t len = sizeof REPLIES - 1;
    fb_resp_tally t;
    uint32_t idx[8];
    CHECK_EQ(fb_resp_scan(REPLIES, len, SIZE_MAX, &t, idx, 8), FB_OK);
    CHECK_EQ(t.replies, 18);
    CHECK_EQ(t.consumed, len);
    CHECK_EQ(t.errors, 2);
    CHECK_EQ(idx[0], 2);
    CHECK_EQ(idx[1], 16);
    CHECK_EQ(t.int_sum, 1 + 0 + 2 - 4);
    CHECK(t.first_err_len == strlen("ERR wrong number of arguments") &&
          memcmp(REPLIES + t.first_err_off, "ERR wrong number of arguments", t.first_err_len) == 0);
    /* max_replies stops early, at a reply boundary. */
    CHECK_EQ(fb_resp_scan(REPLIES, len, 3, &t, idx, 8), FB_OK);
    CHECK_EQ(t.replies, 3);
    CHECK_EQ(t.consumed, strlen(":1\r\n:0\r\n-ERR wrong number of arguments\r\n"));
    /* err_cap bounds what is written. */
    idx[0] = 99;
    CHECK_EQ(fb_resp_scan(REPLIES, len, SIZE_MAX, &t, idx, 0), FB_OK);
    CHECK_EQ(idx[0], 99);
    CHECK_EQ(t.errors, 2);
}

static void test_scan_split_anywhere(void)
{
    /* Fed in two parts cut at every byte, the totals are those of the whole,
     * and the first call never consumes a partial reply. */
    size_t len = sizeof REPLIES - 1;
    for (size_t cut = 0; cut <= len; cut++) {
        fb_resp_tally a, b;
        REQUIRE(fb_resp_scan(REPLIES, cut, SIZE_MAX, &a, NULL, 0) == FB_OK);
        CHECK(a.consumed <= cut);
        REQUIRE(fb_resp_scan(REPLIES + a.consumed, len - a.consumed, SIZE_MAX, &b, NULL, 0) == FB_OK);
        CHECK_EQ(a.replies + b.replies, 18);
        CHECK_EQ(a.errors + b.errors, 2);
        CHECK_EQ(a.int_sum + b.int_sum, -1);
        CHECK_EQ(a.consumed + b.consumed, len);
    }
}

static void test_malformed(void)
{
    const char *bad[] = {
        "?\r\n", ":\r\n", ":12a\r\n", ":99999999999999999999\r\n", "$-2\r\n", "$abc\r\n",
        "$3\r\nabcd\r\n", "*-2\r\n", "$536870913\r\n", "*4294967296\r\n", ":1\rx", "|1\r\n+a\r\n+b\r\n+c\r\n",
        "_x\r\n",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        fb_resp_tally t;
        int rc = fb_resp_scan(bad[i], strlen(bad[i]), SIZE_MAX, &t, NULL, 0);
        if (rc != FB_EMALFORMED) fprintf(stderr, "accepted: %s\n", bad[i]);
        CHECK_EQ(rc, FB_EMALFORMED);
        CHECK_EQ(t.replies, 0);
    }
    /* Good replies before a bad one are reported. */
    fb_resp_tally t;
    CHECK_EQ(fb_resp_scan(":1\r\n:2\r\n?\r\n", 11, SIZE_MAX, &t, NULL, 0), FB_EMALFORMED);
    CHECK_EQ(t.replies, 2);
    CHECK_EQ(t.consumed, 8);
    /* A huge declared aggregate that is not there is just incomplete. */
    CHECK_EQ(fb_resp_scan("*4000000000\r\n:1\r\n", 17, SIZE_MAX, &t, NULL, 0), FB_OK);
    CHECK_EQ(t.replies, 0);
    CHECK_EQ(fb_resp_scan(NULL, 0, SIZE_MAX, &t, NULL, 0), FB_OK);
}

static void test_garbage(void)
{
    /* Random bytes (biased towards RESP's alphabet) never crash or read out
     * of bounds (the sanitizer build checks), and what is consumed is
     * within the input. */
    static const char alphabet[] = ":$*+-%~>_,#(=!\r\n0123456789-x";
    unsigned char buf[64];
    for (int round = 0; round < 200000; round++) {
        size_t n = rndn(sizeof buf);
        for (size_t i = 0; i < n; i++)
            buf[i] = rndn(4) ? (unsigned char)alphabet[rndn(sizeof alphabet - 1)] : (unsigned char)rnd();
        unsigned char *copy = malloc(n ? n : 1);      /* exact size: ASan sees overreads */
        REQUIRE(copy);
        memcpy(copy, buf, n);
        fb_resp_tally t;
        uint32_t idx[4];
        int rc = fb_resp_scan(copy, n, SIZE_MAX, &t, idx, 4);
        CHECK(rc == FB_OK || rc == FB_EMALFORMED);
        CHECK(t.consumed <= n);
        CHECK(t.errors <= t.replies);
        free(copy);
    }
}

static void test_flat_array(void)
{
    const char *m = "*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$4\r\na\r\nb\r\n"
                    "*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n";
    fb_resp_elem el[4];
    size_t used;
    size_t len = strlen(m);
    CHECK_EQ(fb_resp_flat_array(m, len, el, 4, &used), 3);
    CHECK(el[0].len == 7 && memcmp(el[0].ptr, "message", 7) == 0 && !el[0].is_int);
    CHECK(el[2].len == 4 && memcmp(el[2].ptr, "a\r\nb", 4) == 0);
    size_t first = used;
    CHECK_EQ(fb_resp_flat_array(m + first, len - first, el, 4, &used), 3);
    CHECK(el[2].is_int && el[2].len == 1 && el[2].ptr[0] == '1');
    CHECK_EQ(first + used, len);
    /* Every cut is "incomplete", never an error or an overread. */
    for (size_t cut = 0; cut < first; cut++) {
        char *copy = malloc(cut ? cut : 1);
        REQUIRE(copy);
        memcpy(copy, m, cut);
        CHECK_EQ(fb_resp_flat_array(copy, cut, el, 4, &used), 0);
        CHECK_EQ(used, 0);
        free(copy);
    }
    CHECK_EQ(fb_resp_flat_array("*5\r\n", 5, el, 4, &used), FB_EMALFORMED);     /* too many */
    CHECK_EQ(fb_resp_flat_array("+OK\r\n", 5, el, 4, &used), FB_EMALFORMED);
    CHECK_EQ(fb_resp_flat_array("*1\r\n*0\r\n", 9, el, 4, &used), FB_EMALFORMED); /* nested */
    CHECK_EQ(fb_resp_flat_array("*1\r\n$-1\r\n", 10, el, 4, &used), 1);
    CHECK(el[0].ptr == NULL);
}

static void test_key_slot(void)
{
    /* Values from the Redis Cluster specification and redis-cli. */
    CHECK_EQ(fb_resp_key_slot("123456789", 9), 0x31C3 & 16383);
    CHECK_EQ(fb_resp_key_slot("foo", 3), 12182);
    CHECK_EQ(fb_resp_key_slot("{user1000}.following", 20), fb_resp_key_slot("user1000", 8));
    CHECK_EQ(fb_resp_key_slot("foo{}{bar}", 10), fb_resp_key_slot("foo{}{bar}", 10));
    CHECK_EQ(fb_resp_key_slot("foo{{bar}}zap", 13), fb_resp_key_slot("{bar", 4));
    CHECK_EQ(fb_resp_key_slot("", 0), 0);
    CHECK_EQ(fb_resp_key_slot(NULL, 5), 0);
}

static void put(int fd, const char *s)
{
    REQUIRE(write(fd, s, strlen(s)) == (ssize_t)strlen(s));
}

static void test_pump_basics(void)
{
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    fb_resp_reader rd;
    fb_resp_reader_init(&rd);
    fb_resp_tally t;
    uint32_t idx[4];
    put(sv[1], ":1\r\n-ERR bad thing\r\n:2\r\n:3");     /* the last one incomplete */
    CHECK_EQ(fb_resp_pump(sv[0], "abc", 3, 2, 1000, &rd, &t, idx, 4), FB_OK);
    CHECK_EQ(t.replies, 2);
    CHECK_EQ(t.errors, 1);
    CHECK_EQ(idx[0], 1);
    CHECK(rd.first_err_len == 13 && strcmp(rd.first_err, "ERR bad thing") == 0);
    char got[8] = { 0 };
    CHECK_EQ(read(sv[1], got, sizeof got), 3);           /* the data went out */
    CHECK(memcmp(got, "abc", 3) == 0);
    /* The rest: one buffered, one completed by the next bytes. */
    put(sv[1], "\r\n");
    CHECK_EQ(fb_resp_pump(sv[0], NULL, 0, 2, 1000, &rd, &t, idx, 4), FB_OK);
    CHECK_EQ(t.replies, 2);
    CHECK_EQ(t.int_sum, 5);
    CHECK_EQ(t.errors, 0);
    CHECK_EQ(rd.first_err_len, 0);
    /* Nothing more comes: a timeout, nothing consumed. */
    CHECK_EQ(fb_resp_pump(sv[0], NULL, 0, 1, 50, &rd, &t, NULL, 0), FB_ETIMEOUT);
    CHECK_EQ(t.replies, 0);
    /* Garbage from the peer. */
    put(sv[1], ":1\r\n?\r\n");
    CHECK_EQ(fb_resp_pump(sv[0], NULL, 0, 2, 1000, &rd, &t, NULL, 0), FB_EMALFORMED);
    CHECK_EQ(t.replies, 1);
    fb_resp_reader_reset(&rd);
    CHECK_EQ(rd.len, 0);
    /* The peer goes away. */
    close(sv[1]);
    CHECK_EQ(fb_resp_pump(sv[0], NULL, 0, 1, 1000, &rd, &t, NULL, 0), FB_ECLOSED);
    CHECK_EQ(fb_resp_pump(sv[0], "x", 1, 0, 1000, &rd, &t, NULL, 0) < 0, 1);
    close(sv[0]);
    fb_resp_reader_destroy(&rd);
}

static void test_pump_large_pipeline(void)
{
    /* 2 MB of commands against a peer that reads them all and answers each:
     * more than the socket buffers hold, so writing and reading interleave. */
    enum { N = 50000 };
    fb_outbox o;
    REQUIRE(fb_outbox_init_resp(&o, NULL, "PUBLISH") == FB_OK);
    char payload[20];
    memset(payload, 'p', sizeof payload);
    for (int i = 0; i < N; i++) REQUIRE(fb_outbox_append(&o, "chan", 4, payload, sizeof payload, 0) >= 0);
    unsigned char *b;
    size_t n;
    REQUIRE(fb_outbox_take(&o, &b, &n) == FB_OK);
    int sv[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {                  /* the "server": count commands, answer each */
        close(sv[0]);
        fb_resp_reader rd;
        fb_resp_reader_init(&rd);
        size_t answered = 0;
        while (answered < N) {
            fb_resp_tally t;
            if (fb_resp_pump(sv[1], NULL, 0, 1, 5000, &rd, &t, NULL, 0) != FB_OK) _exit(2);
            if (write(sv[1], ":1\r\n", 4) != 4) _exit(3);
            answered++;
        }
        _exit(0);
    }
    close(sv[1]);
    fb_resp_reader rd;
    fb_resp_reader_init(&rd);
    fb_resp_tally t;
    CHECK_EQ(fb_resp_pump(sv[0], b, n, N / 2, 10000, &rd, &t, NULL, 0), FB_OK);
    CHECK_EQ(t.replies, N / 2);
    size_t total = t.replies;
    CHECK_EQ(fb_resp_pump(sv[0], NULL, 0, N - total, 10000, &rd, &t, NULL, 0), FB_OK);
    total += t.replies;
    CHECK_EQ(total, N);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sv[0]);
    free(b);
    fb_outbox_destroy(&o);
    fb_resp_reader_destroy(&rd);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    RUN(test_encode_commands);
    RUN(test_verbs);
    RUN(test_big_payload_sizes);
    RUN(test_scan);
    RUN(test_scan_split_anywhere);
    RUN(test_malformed);
    RUN(test_garbage);
    RUN(test_flat_array);
    RUN(test_key_slot);
    RUN(test_pump_basics);
    RUN(test_pump_large_pipeline);
    CTEST_END();
}
