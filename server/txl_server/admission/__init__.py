"""Admission control: who is served now, who waits for a place in the batch, and who is told, at once, when to
come back.

A crowd past the device's knee used to be admitted whole, and then every request missed its targets (goodput
fell to zero). This package holds the policies that answer overload with a contract instead, each a pure object
whose decisions are values (tested with fakes, as `engine.scheduler` is):

- `classes`: a request's class: its tenant, its `service_tier` (priority, default, flex) and its lane
  (interactive, flex, batch), carried from the HTTP edge to the jobs it makes.
- `targets`: the latency targets, time to first token and time between tokens (measured for the device at
  start-up when not set).
- `pacing`: how large the batch may grow before the gap between tokens passes its target, how many prompt tokens
  ride beside it, and how much time flex and batch work may take from running streams.
- `fair_share`: weighted max-min shares of the batch's rows between tenants, and virtual token counters
  (VTC, Sheng et al., OSDI 2024) that order the tenants' waiting work by the service they had.
- `estimate`: when a new request's first token would come, from the work ahead of it, the rows in the batch and
  the measured step times.
- `policy`: admit, or refuse with a reason and a Retry-After computed from how fast the queue drains (`retry`).
- `slots`: the HTTP layer's concurrency slots, per tenant, so that one tenant cannot take another's.
"""
