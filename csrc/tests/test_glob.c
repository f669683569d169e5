/* test_glob.c - Redis's glob patterns (fb_glob.h): Redis's documented
 * cases and its edge cases, the literal prefix, and random patterns against
 * a plain recursive reading of the same rules. */
#include <string.h>

#include "ctest.h"
#include "fb_glob.h"

static int m(const char *p, const char *s) { return fb_glob_match(p, strlen(p), s, strlen(s)); }

static void test_redis_documented_cases(void)
{
    /* The examples of Redis's KEYS / PSUBSCRIBE documentation. */
    CHECK(m("h?llo", "hello") && m("h?llo", "hallo") && m("h?llo", "hxllo"));
    CHECK(m("h*llo", "hllo") && m("h*llo", "heeeello"));
    CHECK(m("h[ae]llo", "hello") && m("h[ae]llo", "hallo") && !m("h[ae]llo", "hillo"));
    CHECK(m("h[^e]llo", "hallo") && m("h[^e]llo", "hbllo") && !m("h[^e]llo", "hello"));
    CHECK(m("h[a-b]llo", "hallo") && m("h[a-b]llo", "hbllo") && !m("h[a-b]llo", "hcllo"));
    CHECK(m("news.*", "news.") && m("news.*", "news.sport") && !m("news.*", "news"));
    CHECK(m("*", "") && m("*", "anything") && m("**", "x") && !m("?", "") && m("", "") && !m("", "a"));
    CHECK(m("user.*.events", "user.42.events") && !m("user.*.events", "user.42.event"));
    CHECK(m("a*b*c", "abc") && m("a*b*c", "axxbyyc") && !m("a*b*c", "axxbyy") && m("*a*a*", "aa"));
}

static void test_redis_edge_cases(void)
{
    CHECK(m("\\*", "*") && !m("\\*", "x") && m("\\?x", "?x"));      /* escapes */
    CHECK(m("a\\", "a\\") && !m("a\\", "a"));                       /* a final \ is itself */
    CHECK(m("[\\]]", "]") && m("[a\\-z]", "-") && !m("[a\\-z]", "b"));
    CHECK(!m("[]", "a") && !m("[]", "]") && m("[^]", "a"));           /* an empty class; a negated one */
    CHECK(m("[abc", "a") && !m("[abc", "d") && !m("[", "a") && m("[^", "a"));  /* unterminated: to the end */
    CHECK(m("[z-a]", "m") && !m("[z-a]", "A"));                     /* ends swapped */
    /* As Redis reads it: "a-]" is a range a..']' (swapped: ']'..a), and the
     * class then runs to the end; a leading '-' is itself. */
    CHECK(m("[a-]", "a") && m("[a-]", "]") && m("[a-]", "_") && !m("[a-]", "-") && m("[-a]", "-"));
    CHECK(!m("[\x01-\xff]", "a"));                                  /* signed, as in Redis: 1..-1 is empty */
    const char p[] = {'a', 0, '*'}, s[] = {'a', 0, 'b'};              /* bytes, NUL included */
    CHECK(fb_glob_match(p, 3, s, 3) && !fb_glob_match(p, 3, "a", 1));
}

static void test_literal_prefix(void)
{
    char out[64];
    int star = -1;
    size_t n = fb_glob_prefix("news.*", 6, out, &star);
    CHECK(n == 5 && memcmp(out, "news.", 5) == 0 && star == 1);
    n = fb_glob_prefix("news.**", 7, out, &star);
    CHECK(n == 5 && star == 1);
    n = fb_glob_prefix("user.*.events", 13, out, &star);
    CHECK(n == 5 && memcmp(out, "user.", 5) == 0 && star == 0);
    n = fb_glob_prefix("room.?", 6, out, &star);
    CHECK(n == 5 && star == 0);
    n = fb_glob_prefix("a\\*b*", 5, out, &star);                   /* \* is a literal star */
    CHECK(n == 3 && memcmp(out, "a*b", 3) == 0 && star == 1);
    n = fb_glob_prefix("plain", 5, out, &star);                    /* no special: only itself */
    CHECK(n == 5 && star == 0);
    n = fb_glob_prefix("*x", 2, out, &star);
    CHECK(n == 0 && star == 0);
    n = fb_glob_prefix("x\\", 2, out, &star);
    CHECK(n == 2 && memcmp(out, "x\\", 2) == 0 && star == 0);
}

/* The rules read plainly (recursive, as Redis's own): the model. */
static int model(const unsigned char *p, size_t pl, const unsigned char *s, size_t sl)
{
    if (pl == 0) return sl == 0;
    if (*p == '*') return model(p + 1, pl - 1, s, sl) || (sl > 0 && model(p, pl, s + 1, sl - 1));
    if (sl == 0) return 0;
    if (*p == '?') return model(p + 1, pl - 1, s + 1, sl - 1);
    if (*p == '\\') {
        if (pl >= 2) return p[1] == *s && model(p + 2, pl - 2, s + 1, sl - 1);
        return *s == '\\' && model(p + 1, pl - 1, s + 1, sl - 1);
    }
    if (*p == '[') {
        size_t i = 1;
        int neg = 0, hit = 0;
        if (i < pl && p[i] == '^') {
            neg = 1;
            i++;
        }
        for (;;) {
            if (i >= pl) break;
            if (p[i] == '\\' && pl - i >= 2) {
                hit |= p[i + 1] == *s;
                i += 2;
            } else if (p[i] == ']') {
                i++;
                break;
            } else if (pl - i >= 3 && p[i + 1] == '-') {
                int a = (signed char)p[i], b = (signed char)p[i + 2], c = (signed char)*s;
                if (a > b) { int t = a; a = b; b = t; }
                hit |= c >= a && c <= b;
                i += 3;
            } else {
                hit |= p[i] == *s;
                i++;
            }
        }
        if (neg) hit = !hit;
        return hit && model(p + i, pl - i, s + 1, sl - 1);
    }
    return *p == *s && model(p + 1, pl - 1, s + 1, sl - 1);
}

static void test_random_patterns_against_the_model(void)
{
    static const char pat_alpha[] = "ab*?[]^-\\";
    static const char str_alpha[] = "ab-]^\\*?[";
    unsigned char p[12], s[10];
    for (int round = 0; round < 200000; round++) {
        size_t pl = rndn(sizeof p), sl = rndn(sizeof s);
        for (size_t i = 0; i < pl; i++) p[i] = (unsigned char)pat_alpha[rndn(sizeof pat_alpha - 1)];
        for (size_t i = 0; i < sl; i++) s[i] = (unsigned char)str_alpha[rndn(sizeof str_alpha - 1)];
        int want = model(p, pl, s, sl), got = fb_glob_match(p, pl, s, sl);
        if (want != got) {
            CHECK_EQ(got, want);
            fprintf(stderr, "  pattern %.*s string %.*s\n", (int)pl, (const char *)p, (int)sl, (const char *)s);
        }
        /* Whatever matches starts with the literal prefix. */
        unsigned char pre[12];
        int star;
        size_t n = fb_glob_prefix(p, pl, pre, &star);
        if (got) CHECK(n <= sl && memcmp(pre, s, n) == 0);
        if (star && sl >= n && memcmp(pre, s, n) == 0) CHECK(got);
    }
}

int main(void)
{
    RUN(test_redis_documented_cases);
    RUN(test_redis_edge_cases);
    RUN(test_literal_prefix);
    RUN(test_random_patterns_against_the_model);
    CTEST_END();
}
