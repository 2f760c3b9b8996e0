"""The offload stage: from the source's entries to committed segments in the tier.

==================  ==============================================================================
``scheduler.py``    which topics run: discovery, ownership, one task per topic, reaping
``topic.py``        ``TopicOffloader``, one topic's task: recovery, the loop, failure and backoff
``streaming.py``    streaming mode (PIP-76): segments that roll by size or time across ledgers
``ledger_mode.py``  ledger-based mode (PIP-17): closed ledgers offloaded whole
``attempt.py``      ``SegmentAttempt``: open, feed runs, seal (data object, then index), abort
``runs.py``         ``RunReader``: block-sized runs read into the shared buffer
``roller.py``       when to roll and how much to read (pure)
``threshold.py``    what stays only in the source for now (pure)
``upload.py``       ``SegmentUpload``: one data object as a multipart upload, parts in flight
``buffer.py``       ``OffloadBuffer``: the byte budget every topic reads into
``throttle.py``     ``Throttle``: the broker-wide byte rate (PIP-211)
``policy.py``       ``PolicySource``: topic policies and throttle requests, one object
``recorder.py``     ``StatusRecorder``: a topic's persisted offload status
``lag.py``          how far the tier trails each topic
==================  ==============================================================================
"""
