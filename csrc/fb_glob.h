/*
 * fb_glob.h - Redis's glob patterns (PSUBSCRIBE, KEYS): matching, and the
 * literal prefix a matching channel starts with.
 *
 * The syntax and its edge cases are Redis's (util.c stringmatchlen), so a
 * pattern matches in fastbus exactly what it matches in Redis:
 *   *        any run of bytes, the empty one too
 *   ?        any one byte
 *   [abc]    one of the bytes listed; [^abc] one not listed; [a-z] a range
 *            (ends given high-low are swapped); \x in a class is x; a class
 *            the pattern ends inside runs to the end; [] matches nothing
 *            and [^] any byte
 *   \x       the byte x (a \ that ends the pattern is itself)
 * Bytes, not text: no case folding, no UTF-8.  A range compares bytes as
 * Redis does, as signed chars (so [a-\xff] is not what it looks like).
 *
 * A broker holds a glob under its literal prefix (a prefix subscription:
 * the trie and the forwarders work on prefixes) and the hop that delivers
 * matches the whole pattern (fb_glob_match).  The match is iterative
 * (backtracking only to the last '*'): a pattern of many stars costs
 * O(pattern x channel), never a deep recursion.
 */
#ifndef FB_GLOB_H
#define FB_GLOB_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if the glob matches the whole string, else 0. */
int fb_glob_match(const void *pattern, size_t plen, const void *string, size_t slen);

/* The literal prefix every string the glob matches starts with: written
 * (unescaped) to out, which has room for plen bytes; returns its length.
 * *is_prefix_star is set to 1 if the glob is exactly that prefix followed by
 * '*'s (then every string with the prefix matches, and a prefix
 * subscription needs no further check), else 0. */
size_t fb_glob_prefix(const void *pattern, size_t plen, void *out, int *is_prefix_star);

#ifdef __cplusplus
}
#endif
#endif /* FB_GLOB_H */
