/* fake_msg.h - messages for the tests of what queues libzmq messages
 * (fb_linkq.h, fb_links.h, fb_leases.h): a test's own, malloc'd, so that
 * ASan sees every one closed once, and `live` counts those not closed.
 * A message made with init_data calls its free function when closed, as
 * libzmq's does. */
#ifndef FAKE_MSG_H
#define FAKE_MSG_H
#include <stdlib.h>
#include <string.h>

#include "fb_linkq.h"

typedef struct { void *data; size_t size; void (*ffn)(void *, void *); void *hint; } fake;

static int live;                                     /* messages holding memory, not closed */

static int m_init(fb_zmq_msg *m) { memset(m, 0, sizeof(fake)); return 0; }
static int m_init_size(fb_zmq_msg *m, size_t n)
{
    fake *f = (fake *)m;
    memset(f, 0, sizeof(*f));
    f->data = malloc(n ? n : 1);
    if (!f->data) return -1;
    f->size = n;
    live++;
    return 0;
}
static int m_init_data(fb_zmq_msg *m, void *data, size_t n, void (*ffn)(void *, void *), void *hint)
{
    fake *f = (fake *)m;
    f->data = data;
    f->size = n;
    f->ffn = ffn;
    f->hint = hint;
    live++;
    return 0;
}
static int m_close(fb_zmq_msg *m)
{
    fake *f = (fake *)m;
    if (f->data) {
        if (f->ffn) f->ffn(f->data, f->hint);
        else free(f->data);
        live--;
    }
    memset(f, 0, sizeof(*f));
    return 0;
}
static void *m_data(fb_zmq_msg *m) { return ((fake *)m)->data; }

static const fb_zmq_msg_calls Z = {m_init, m_init_size, m_close, m_data, m_init_data};
#endif
