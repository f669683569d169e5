# Mirrors csrc/fb_glob.h
cdef extern from "fb_glob.h" nogil:
    int fb_glob_match(const void *pattern, size_t plen, const void *string, size_t slen)
    size_t fb_glob_prefix(const void *pattern, size_t plen, void *out, int *is_prefix_star)
