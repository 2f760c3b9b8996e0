"""The commit stage: who may write a topic's records, and how every write is made.

==================  =============================================================================
``epochs.py``       topic ownership epochs: acquire (owner node + epoch bump), release, the fence op
``fence.py``        ``Fence``: ``EpochFence`` (one acquisition's guard), ``NoFence``; take/give back
``edits.py``        ``apply``: a pure catalog edit under compare-and-set with the fence's guard (the
                    segment state table is the model's, ``offloadd.model.segment_state``)
``batch.py``        ``CommitBatcher``: many topics' writes in one store request, each fenced
``ownership.py``    the scheduler's ownership hook (``Ownership``, ``Revoke``): owns everything
``cluster.py``      ``ClusterOwnership``: members, rendezvous hashing, fenced acquisition, sessions
==================  =============================================================================

Every write goes through the one compare-and-set loop (:mod:`offloadd.metadata.cas`) with the
one backoff policy (:mod:`offloadd.retry`).
"""
