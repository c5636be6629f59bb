"""The leaf layer: what every other layer may import and which imports nothing of qbackend's but
the compiled extension.

  extension.py loads the compiled extension qbackend._C once, with the QBACKEND_ISA cap applied
  isa.py       instruction-set levels (Isa) and the QBACKEND_ISA cap
  routes.py    the typed routing result: Route, BatchRoutes
  batches.py   the batches users pass (calibration, evaluation) and inputs bound by name
  version.py   qbackend's version
"""
