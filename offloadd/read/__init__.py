"""Reading the tier back.

==================  ==============================================================================
``reader.py``       ``TierReader``: entries by position across segments and both formats
``check.py``        the daemon's read-back check of what each topic just committed
``verify.py``       ``offloadd verify``: the tier is complete, readable and right
==================  ==============================================================================

Reads only committed segments through the catalog (:mod:`offloadd.model.catalog`); imports
nothing of the offload stage.
"""
