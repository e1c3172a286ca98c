"""Free TCP ports on 127.0.0.1, for clusters on one machine (the tests and
docs/cluster_speed.py)."""

import socket


def free_local_ports(n):
  """n distinct free TCP ports on 127.0.0.1.

  Args:
    n: how many ports.

  Returns:
    A list of n port numbers.
  """
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(('127.0.0.1', 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports
