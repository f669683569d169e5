/*
 * fastbus.h - the fastbus core, for brokers and programs that embed it.
 *
 *   fb_trie.h       subscription trie: exact and prefix keys, match, remove_subscriber
 *   fb_forwarder.h  minimal upstream subscription diffs (dedup / subsume, cap, snapshot)
 *   fb_batch.h      the batch wire format: decode, CRC32C
 *   fb_outbox.h     per-destination batch buffers with a flush policy
 *   fb_router.h     a broker's routing step: a batch into per-link outboxes
 *   fb_glob.h       Redis's glob patterns: match, literal prefix
 *   fb_resp.h       reading Redis replies (RESP), many per call
 *   fb_common.h     status codes, id vectors, key lists
 *   fb_protocol.h   the wire protocol's command bytes and flag bits
 *   fb_ring.h       what a resumable session was sent, kept for its resume
 *   fb_linkq.h      a broker link's send queue
 *   fb_links.h      a broker's links: their state by number and routing id, the lists over them
 *   fb_leases.h     a session's PING answered in a broker's data plane (PONG, the lease granted)
 *   fb_zmq_api.h    the libzmq calls a data plane makes, as a table (no zmq.h)
 *
 * Plain C11, no dependencies.  Build with the Makefile in this directory
 * (libfastbus.a) or compile the .c files into your program.
 */
#ifndef FASTBUS_H
#define FASTBUS_H

#include "fb_common.h"
#include "fb_protocol.h"
#include "fb_ring.h"
#include "fb_linkq.h"
#include "fb_links.h"
#include "fb_leases.h"
#include "fb_zmq_api.h"
#include "fb_trie.h"
#include "fb_forwarder.h"
#include "fb_batch.h"
#include "fb_outbox.h"
#include "fb_router.h"
#include "fb_replies.h"
#include "fb_resp.h"
#include "fb_glob.h"

#endif /* FASTBUS_H */
