"""The shell: the commands and the process around the pipeline.

==================  ==============================================================================
``cli.py``          ``offloadd <command>``: argument parsing and one function per command
``service.py``      ``offloadd run``: pid file, store lock, systemd notify, the daemon
``standalone.py``   ``offloadd standalone``: the embedded writer and the daemon in one process
``runtime.py``      a process's composition: stores, source, daemon, metrics, HTTP, lakehouse
``daemon.py``       the daemon's lifecycle: signals, reload, discovery passes, the background loops
``pidfile.py``      the locked pid file, and finding the daemon that holds it
``httpserver.py``   ``/metrics``, ``/healthz``, ``/readyz``, ``/status``, ``POST /offload-now``
``status.py``       ``offloadd status``: per topic, from the stores (and the daemon when it answers)
``produce.py``      the embedded writer's workload (``offloadd produce``, ``standalone``)
``ttyline.py``      a one-line progress display on a terminal
==================  ==============================================================================

Nothing below the shell imports it.
"""
