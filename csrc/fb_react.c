/* fb_react.c - see fb_react.h. */
#define _POSIX_C_SOURCE 200809L
#include "fb_react.h"

#include <limits.h>
#include <string.h>

#include "fb_common.h"

/* zmq.h's values (stable across libzmq 4.x; a Stream's send takes the same). */
#define Z_DONTWAIT 1
#define Z_SNDMORE 2

static uint64_t get_u64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static int is(const unsigned char *frame, size_t len, const void *command, size_t command_len)
{
    return command && len == command_len && memcmp(frame, command, len) == 0;
}

/* A FLOW or a WELCOME (see fb_react.h): -1 if it is neither, else what
 * became of it. */
static int take_flow(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l)
{
    if (!x->flow_paused) return -1;
    int pause, flow = 0;
    if (is(f[0], l[0], x->flow_reset_command, x->flow_reset_command_len)) {
        pause = 0;
    } else {
        if (n != 2 || !is(f[0], l[0], x->flow_command, x->flow_command_len)) return -1;
        if (l[1] != 1) return FB_REACT_OWNER;
        pause = f[1][0] == x->flow_pause;
        flow = 1;
    }
    int was = __atomic_exchange_n(x->flow_paused, pause, __ATOMIC_SEQ_CST);
    if (flow && pause && !was) __atomic_add_fetch(&x->flow_pauses, 1, __ATOMIC_SEQ_CST);
    if (!pause && x->flow_wake) fb_wake_signal(x->flow_wake);    /* send what waited */
    return flow ? FB_REACT_TAKEN : FB_REACT_OWNER;               /* (a WELCOME is the owner's too) */
}

/* An ACK due after a WANT or a lease: sent now if the socket takes it. */
static int send_ack(fb_react *x, uint64_t seq, uint64_t *ack)
{
    if (!seq) return FB_REACT_TAKEN;
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(seq >> (8 * i));
    if (x->send(x->sock, x->ack_command, x->ack_command_len, Z_DONTWAIT | Z_SNDMORE) >= 0) {
        /* ZeroMQ takes a message's later frames once it took its first. */
        x->send(x->sock, b, 8, Z_DONTWAIT);
        fb_view_acked(x->view, seq);
        return FB_REACT_TAKEN;
    }
    /* Not now (reconnecting, or the queue to the broker full): the owner
     * sends it its own way. */
    *ack = seq;
    return FB_REACT_ACK;
}

static int take_want(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l, uint64_t *ack)
{
    if (!x->view || (n != 3 && n != 4) || !is(f[0], l[0], x->want_command, x->want_command_len)) return -1;
    uint64_t seq = 0, due = 0;
    if (n == 4) {
        if (l[3] != 8) goto refused;
        seq = get_u64(f[3]);
    }
    if (fb_view_apply(x->view, l[1] ? f[1][0] : 0, f[2], l[2], n == 4, seq, fb_now_ns(), &due) < 0) goto refused;
    return send_ack(x, due, ack);
refused:
    __atomic_add_fetch(&x->wants_refused, 1, __ATOMIC_SEQ_CST);
    return FB_REACT_OWNER;
}

/* A PONG to a lease ping (its token: lease_token, then the ping's send
 * time).  One without a lease (the broker did not know this session) lets
 * the renewal be asked for again, and is the owner's, who sees which
 * broker answered. */
static int take_lease_pong(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l, uint64_t *ack)
{
    if (!x->view || (n != 3 && n != 4) || !is(f[0], l[0], x->pong_command, x->pong_command_len)) return -1;
    if (l[1] != x->lease_token_len + 8 || memcmp(f[1], x->lease_token, x->lease_token_len) != 0) return -1;
    if (n == 3) {
        fb_view_renewal_answered(x->view);
        return FB_REACT_OWNER;
    }
    if (l[3] != 8) return FB_REACT_OWNER;
    uint64_t due = fb_view_lease(x->view, get_u64(f[1] + x->lease_token_len), get_u64(f[3]));
    return send_ack(x, due, ack);
}

static int take_live_pong(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l)
{
    if (!x->ping_interval_ns || !x->instance_len || n != 3 ||
        !is(f[0], l[0], x->live_pong_command, x->live_pong_command_len))
        return -1;
    if (l[1] != 0 || l[2] != x->instance_len || memcmp(f[2], x->instance, l[2]) != 0)
        return -1;                  /* a flush's, a lease's, or another broker: the owner's */
    __atomic_add_fetch(&x->pongs_taken, 1, __ATOMIC_SEQ_CST);
    return FB_REACT_TAKEN;
}

static int take_took(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l)
{
    if (!x->took || n != 2 || !is(f[0], l[0], x->took_command, x->took_command_len)) return -1;
    if (l[1] != 8) return FB_REACT_OWNER;
    x->took(x->sock, get_u64(f[1]));
    return FB_REACT_TAKEN;
}

int fb_react_message(fb_react *x, size_t n, const unsigned char *const *f, const size_t *l, uint64_t *ack)
{
    if (n == 0 || n > FB_REACT_FRAMES_MAX) return FB_REACT_OWNER;
    int fate;
    if ((fate = take_flow(x, n, f, l)) >= 0) return fate;
    if ((fate = take_want(x, n, f, l, ack)) >= 0) return fate;
    if ((fate = take_lease_pong(x, n, f, l, ack)) >= 0) return fate;
    if ((fate = take_live_pong(x, n, f, l)) >= 0) return fate;
    if ((fate = take_took(x, n, f, l)) >= 0) return fate;
    return FB_REACT_OWNER;
}

void fb_react_set_instance(fb_react *x, const void *instance, size_t len)
{
    if (len > sizeof x->instance) len = 0;
    if (len) memcpy(x->instance, instance, len);
    x->instance_len = len;
}

int fb_react_ping_if_due(fb_react *x, uint64_t now)
{
    if (!x->ping_interval_ns || now < __atomic_load_n(&x->next_ping_ns, __ATOMIC_SEQ_CST)) return 0;
    __atomic_store_n(&x->next_ping_ns, now + x->ping_interval_ns, __ATOMIC_SEQ_CST);
    if (x->send(x->sock, x->ping_command, x->ping_command_len, Z_DONTWAIT | Z_SNDMORE) < 0) return 0;
    x->send(x->sock, "", 0, Z_DONTWAIT);        /* (its first frame taken: the rest is) */
    __atomic_add_fetch(&x->pings_sent, 1, __ATOMIC_SEQ_CST);
    return 1;
}

int fb_react_lease_ping(fb_react *x, uint64_t now, unsigned char *token)
{
    if (!x->view || !x->lease_ask || !x->ping_command || x->lease_token_len > FB_REACT_TOKEN_MAX ||
        !fb_view_take_renewal(x->view))
        return 0;
    /* The lease counts from no later than now: the ping's send time. */
    memcpy(token, x->lease_token, x->lease_token_len);
    for (int i = 0; i < 8; i++) token[x->lease_token_len + i] = (unsigned char)(now >> (8 * i));
    if (x->send(x->sock, x->ping_command, x->ping_command_len, Z_DONTWAIT | Z_SNDMORE) < 0) {
        fb_view_renewal_unsent(x->view);
        return -1;
    }
    /* ZeroMQ takes a message's later frames once it took its first. */
    x->send(x->sock, token, x->lease_token_len + 8, Z_DONTWAIT | Z_SNDMORE);
    x->send(x->sock, x->lease_ask, x->lease_ask_len, Z_DONTWAIT);
    __atomic_add_fetch(&x->lease_pings, 1, __ATOMIC_SEQ_CST);
    return 1;
}

int fb_react_ping_wait_ms(fb_react *x, uint64_t now)
{
    if (!x->ping_interval_ns) return -1;
    uint64_t due = __atomic_load_n(&x->next_ping_ns, __ATOMIC_SEQ_CST);
    if (now >= due) return 0;
    uint64_t ms = (due - now + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}
