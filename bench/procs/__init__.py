"""Servers in processes of their own: ours, the WAN-delay proxy, and the peer servers."""
