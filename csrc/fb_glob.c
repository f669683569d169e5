/* fb_glob.c - see fb_glob.h. */
#include "fb_glob.h"

/* Does the class at p (just after '[') admit c?  *end: just past the
 * class (its ']', or the end of the pattern). */
static int class_admits(const unsigned char *p, const unsigned char *pe, unsigned char c,
                        const unsigned char **end)
{
    int negate = 0, hit = 0;
    if (p < pe && *p == '^') {
        negate = 1;
        p++;
    }
    while (p < pe) {
        if (*p == '\\' && pe - p >= 2) {
            if (p[1] == c) hit = 1;
            p += 2;
        } else if (*p == ']') {
            p++;
            break;
        } else if (pe - p >= 3 && p[1] == '-') {
            /* Signed, as Redis compares them. */
            int lo = (signed char)p[0], hi = (signed char)p[2], v = (signed char)c;
            if (lo > hi) {
                int t = lo;
                lo = hi;
                hi = t;
            }
            if (v >= lo && v <= hi) hit = 1;
            p += 3;
        } else {
            if (*p == c) hit = 1;
            p++;
        }
    }
    *end = p;
    return negate ? !hit : hit;
}

int fb_glob_match(const void *pattern, size_t plen, const void *string, size_t slen)
{
    const unsigned char *p = pattern, *pe = p + plen;
    const unsigned char *s = string, *se = s + slen;
    const unsigned char *star_p = NULL, *star_s = NULL;   /* after the last '*', and where it resumes */
    while (s < se) {
        if (p < pe) {
            const unsigned char *next = p + 1;
            int ok;
            switch (*p) {
            case '*':
                while (p < pe && *p == '*') p++;
                if (p == pe) return 1;                /* a trailing star takes the rest */
                star_p = p;
                star_s = s;
                continue;
            case '?':
                ok = 1;
                break;
            case '[':
                ok = class_admits(p + 1, pe, *s, &next);
                break;
            case '\\':
                if (pe - p >= 2) {
                    ok = p[1] == *s;
                    next = p + 2;
                } else {
                    ok = *s == '\\';
                }
                break;
            default:
                ok = *p == *s;
            }
            if (ok) {
                p = next;
                s++;
                continue;
            }
        }
        /* A mismatch (or pattern left over): the last star takes one byte more. */
        if (!star_p) return 0;
        p = star_p;
        s = ++star_s;
    }
    while (p < pe && *p == '*') p++;
    return p == pe;
}

size_t fb_glob_prefix(const void *pattern, size_t plen, void *out, int *is_prefix_star)
{
    const unsigned char *p = pattern, *pe = p + plen;
    unsigned char *o = out;
    size_t n = 0;
    while (p < pe && *p != '*' && *p != '?' && *p != '[') {
        if (*p == '\\' && pe - p >= 2) p++;       /* \x is x (a final \ is itself) */
        o[n++] = *p++;
    }
    const unsigned char *rest = p;
    while (rest < pe && *rest == '*') rest++;
    *is_prefix_star = p < pe && rest == pe;
    return n;
}
