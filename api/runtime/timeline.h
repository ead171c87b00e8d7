/*
 * The timeline: HVD_TIMELINE=file.json makes rank 0 write Chrome trace
 * events (chrome://tracing, Perfetto) of what each named operation went
 * through: NEGOTIATE_<KIND>, QUEUE, MEMCPY_IN_FUSION_BUFFER, the collective
 * (its args name the transport and the algorithm), MEMCPY_OUT_FUSION_BUFFER.
 * Each name is a row (a trace "process"). Events are written as they
 * happen (flushed once per engine cycle); the file is a valid JSON array
 * once closed. Used by the engine thread only.
 */
#ifndef HVD_API_TIMELINE_H
#define HVD_API_TIMELINE_H

#include <stdint.h>

#include "hvd/types.h"

typedef struct hvd_timeline hvd_timeline;

hvd_status hvd_timeline_open(const char *path, hvd_timeline **out);

/* Writes the end of the JSON array and closes the file; accepts NULL. */
void hvd_timeline_close(hvd_timeline *tl);

/* A duration event of row `tensor` from ts_ns (hvd_now_ns clock); args is
 * a JSON object's members ("\"a\": 1") or NULL. Accepts tl == NULL. */
void hvd_timeline_begin(hvd_timeline *tl, const char *tensor, const char *event,
                        int64_t ts_ns, const char *args);
void hvd_timeline_end(hvd_timeline *tl, const char *tensor, int64_t ts_ns);

/* An instant event across every row (Horovod's CYCLE_START marks). */
void hvd_timeline_mark(hvd_timeline *tl, const char *event, int64_t ts_ns);

void hvd_timeline_flush(hvd_timeline *tl);

#endif
