/* fb_leases.c - a session's PING answered in the data plane (see fb_leases.h). */
#include "fb_leases.h"

#include <errno.h>
#include <string.h>

#include "fb_protocol.h"

enum { DONTWAIT = 1, SNDMORE = 2 };          /* ZMQ_DONTWAIT, ZMQ_SNDMORE */

int fb_leases_set(fb_leases *l, const void *instance, size_t n, uint64_t lease_ns)
{
    if (n > FB_INSTANCE_MAX) {
        errno = EINVAL;
        return -1;
    }
    memcpy(l->instance, instance, n);
    l->instlen = n;
    l->lease_ns = lease_ns;
    return 0;
}

void fb_leases_grant(fb_link *s, uint64_t end_ns)
{
    if (end_ns > s->lease_end_ns) s->lease_end_ns = end_ns;
}

static void answered(fb_leases *l, fb_link *s, int lease_ping, uint64_t now)
{
    l->answered++;
    if (lease_ping) {
        fb_leases_grant(s, now + l->lease_ns);
        l->granted++;
    }
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int fb_leases_pong(fb_leases *l, fb_link *s, const fb_zmq_api *api, void *sock, const fb_zmq_msg_calls *z,
                   const void *token, size_t tlen, const void *ask, size_t asklen, uint64_t now)
{
    int lease_ping = ask != NULL;
    if (!l->instlen) return FB_PONG_NOT;
    if (lease_ping && (!l->lease_ns || !s->acks || asklen != FB_LEASE_ASK_LEN ||
                       memcmp(ask, FB_LEASE_ASK_S, FB_LEASE_ASK_LEN) != 0))
        return FB_PONG_NOT;
    uint8_t lease[8];
    put_u64(lease, l->lease_ns / 1000u);
    if (!s->q.head && !s->q.lost) {
        if (api->send(sock, s->ident, s->idlen, DONTWAIT | SNDMORE) >= 0) {
            api->send(sock, FB_CMD_PONG_S, 1, DONTWAIT | SNDMORE);
            api->send(sock, token, tlen, DONTWAIT | SNDMORE);
            api->send(sock, l->instance, l->instlen, DONTWAIT | (lease_ping ? SNDMORE : 0));
            if (lease_ping) api->send(sock, lease, 8, DONTWAIT);
            s->last_sent_ns = now;
            answered(l, s, lease_ping, now);
            return FB_PONG_SENT;
        }
        int err = api->last_error();
        if (err != EAGAIN && err != 0) return FB_PONG_GONE;
    }
    /* Behind what waits for it. */
    fb_qentry *e = fb_qentry_new(z, lease_ping ? 4 : 3);
    if (!e) return FB_PONG_NOT;
    e->cmd = FB_CMD_PONG;
    if (fb_qentry_frame(z, e, 0, FB_CMD_PONG_S, 1) < 0 || fb_qentry_frame(z, e, 1, token, tlen) < 0 ||
            fb_qentry_frame(z, e, 2, l->instance, l->instlen) < 0 ||
            (lease_ping && fb_qentry_frame(z, e, 3, lease, 8) < 0)) {
        fb_qentry_free(z, e);
        return FB_PONG_NOT;
    }
    fb_linkq_push(&s->q, e);
    answered(l, s, lease_ping, now);
    return FB_PONG_QUEUED;
}
