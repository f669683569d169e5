# Mirrors csrc/fb_common.h
from libc.stdint cimport uint32_t, uint64_t

cdef extern from "fb_common.h" nogil:
    enum:
        FB_VERSION_MAJOR
        FB_VERSION_MINOR
        FB_VERSION_PATCH

    enum:
        FB_OK
        FB_ENOMEM
        FB_EINVAL
        FB_ENOTFOUND
        FB_ETOOBIG
        FB_EOVERFLOW
        FB_EMALFORMED
        FB_ETRUNCATED
        FB_EVERSION
        FB_ELIMIT
        FB_ECHECKSUM
        FB_EIO
        FB_ECLOSED
        FB_ETIMEOUT

    enum:
        FB_EXACT
        FB_PREFIX

    enum:
        FB_OP_UNSUBSCRIBE
        FB_OP_SUBSCRIBE

    size_t FB_MAX_KEY

    ctypedef struct fb_span:
        const unsigned char *ptr
        size_t len

    const char *fb_strerror(int code)
    uint64_t fb_now_ns()
    void fb_free(void *p)

    ctypedef struct fb_idvec:
        uint64_t *ids
        size_t n
        size_t cap

    void fb_idvec_init(fb_idvec *v)
    void fb_idvec_free(fb_idvec *v)
    void fb_idvec_clear(fb_idvec *v)
    int fb_idvec_reserve(fb_idvec *v, size_t extra)

    uint32_t FB_KL_PREFIX
    uint32_t FB_KL_SUBSCRIBE

    ctypedef struct fb_keyent:
        uint32_t flags
        uint32_t count
        size_t off
        size_t len

    ctypedef struct fb_keylist:
        fb_keyent *ents
        size_t n
        size_t cap
        unsigned char *bytes
        size_t nbytes
        size_t capbytes

    void fb_keylist_init(fb_keylist *l)
    void fb_keylist_free(fb_keylist *l)
    void fb_keylist_clear(fb_keylist *l)
    int fb_keylist_push(fb_keylist *l, uint32_t flags, uint32_t count, const void *key, size_t len)
    int fb_keylist_extend(fb_keylist *dst, const fb_keylist *src)
    const unsigned char *fb_keylist_key(const fb_keylist *l, size_t i)
