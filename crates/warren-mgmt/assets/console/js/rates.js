// Message rates from successive samples of the API's counters (message_stats.publish,
// deliver_get, ack, ...): rate = (counter now - counter before) / seconds between the two
// samples. Where the API already gives RabbitMQ's `<field>_details.rate`, that is used.

/** Remembers the last sample of each object's counters and gives rates per second. */
export class Rates {
  constructor() {
    this.last = new Map();
  }

  /**
   * Records `stats` (an object of counters) for `key` taken at `at` (ms) and returns
   * `{field: rate}` for every field in `fields`; a rate is undefined on the first sample
   * or after a counter went backwards (the object was re-created).
   */
  sample(key, stats, fields, at = Date.now()) {
    const prev = this.last.get(key);
    const now = { at, values: {} };
    const out = {};
    for (const f of fields) {
      const v = stats && typeof stats[f] === 'number' ? stats[f] : undefined;
      now.values[f] = v;
      const given = stats && stats[`${f}_details`] && stats[`${f}_details`].rate;
      if (typeof given === 'number') {
        out[f] = given;
      } else if (prev && v !== undefined && prev.values[f] !== undefined && at > prev.at && v >= prev.values[f]) {
        out[f] = ((v - prev.values[f]) * 1000) / (at - prev.at);
      }
    }
    this.last.set(key, now);
    return out;
  }

  /** Forgets objects not in `keys` (deleted queues...). */
  retain(keys) {
    const keep = new Set(keys);
    for (const k of this.last.keys()) if (!keep.has(k)) this.last.delete(k);
  }
}
