"""engined_client.tinker — a Tinker-compatible HTTP gateway over engined
daemons: the unchanged `tinker` SDK 0.38.0 trains (forward_backward,
optim_step, checkpoints) and samples through it. Run it as
`engined-tinker` (cli.py); docs/TINKER.md is the protocol it serves and
the README's "Tinker gateway" section how to point the SDK at it.

  wire.py      the SDK's protobuf bodies in and out
  losses.py    Tinker datums and losses as one engined ForwardBackward
  sequence.py  a training model's requests in seq_id order
  futures.py   request ids and retrieve_future's results
  engines.py   the daemons and the roles the gateway gives them
  gateway.py   what each endpoint does
  app.py       the HTTP routes (Starlette)
  cli.py       the command line (uvicorn)"""
