"""``python3 -m taskd_netrig``: a real PyTorch DDP job under taskd on a two-plane network of
network namespaces, through planned maintenance, a degraded link, a dying link and a subset
switch. Needs root (namespaces, veth pairs, bridges, ``tc``) and torch; see
docs/rig.md."""
