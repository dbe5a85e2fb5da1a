/*
 * delivery.c: how records reach the observers. A delivery moves the synthetic records (resource
 * events, PM samples) into the decoder, hands the held columns of every kind to each observer
 * that selects it, one batch per kind and observer with only the fields that observer selected,
 * then empties the decoder and ages the popped correlation chains.
 *
 * Thread rules. A delivery runs with engine.dec_mu held, which also guards the observer table and
 * the selections it reads: on the decode worker (its cadence, or a kind that reached
 * batch_records) or on a control call's thread (cm_flush, a selection change, the end of a
 * session, a detach, the exit fence). Observer callbacks run inside it, so one engine never runs
 * two callbacks at once and the columns cannot change under a callback.
 */
#include "engine.h"

/* Hands every held record to the observers, then empties the decoder. Called with dec_mu held. */
void cm__engine_deliver(cm_engine *e) {
  cm_column cols[CM__MAX_FIELDS];
  bool any = false;
  uint64_t seq = ++e->drain_seq;
  /* Synthetic records (resource events, PM samples) join the held records first, so they go out
   * now. The PM poll rides this drain: its cadence is the delivery cadence. */
  if (e->cb) cm__callbacks_drain(e->cb, e->dec);
  if (e->pm) cm__pm_drain(e->pm, e->dec);
  for (int k = 0; k < CM_KIND_MAX; k++) {
    uint32_t n = cm__decoder_count(e->dec, k);
    if (!n) continue;
    any = true;
    const cm__kind_desc *desc = cm__kind_desc_get(k);
    /* Newest observer first: while one observer replaces another (the agent's SELECT adds the
     * new one before removing the old), the batch decoded with the new, wider table reaches the
     * replacement before the one it replaces. */
    for (int o = e->nobs - 1; o >= 0; o--) {
      observer *ob = &e->obs[o];
      if (cm__bits_empty(&ob->sel[k])) continue;
      uint32_t nc = 0;
      for (int f = 0; f < desc->nfields; f++) {
        if (!cm__bits_has(&ob->sel[k], f)) continue;
        const cm__field *fd = &desc->fields[f];
        cols[nc].field = f;
        cols[nc].type = fd->type;
        cols[nc].width = fd->width;
        cols[nc].reserved = 0;
        cols[nc].name = fd->name;
        cols[nc].data = cm__decoder_column(e->dec, k, f);
        nc++;
      }
      cm_batch b = {.kind = k, .n = n, .ncols = nc, .cols = cols, .seq = seq};
      ob->fn(ob->ud, &b);
      ADD(e, st_records_delivered, n);
    }
  }
  if (any) ADD(e, st_drains, 1);
  cm__decoder_reset(e->dec);
  /* After the observers ran: popped correlation chains age one drain. Only drains that delivered
   * records count, so idle cadence ticks cannot retire a chain before its records arrive. */
  if (any) cm__corr_drain();
}
