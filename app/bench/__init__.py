"""The benchmark harness: kernels, layers and translation, in process or over party processes
(loopback or emulated LAN/WAN), reporting DESIGN.md's metric names."""
