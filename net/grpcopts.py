"""gRPC channel and server options every mpc3 process uses: the clients' channels to the
parties, the party server, and the peer links when they run over gRPC streams."""

MAX_FRAME_BYTES = 4 << 20          # one gRPC message or one serialised PeerFrame, at most
CHUNK_BYTES = 1 << 20              # data in one chunk of a tensor or of a peer message
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_FRAME_BYTES),
    ("grpc.max_receive_message_length", MAX_FRAME_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
SERVER_OPTIONS = GRPC_OPTIONS + [("grpc.http2.min_ping_interval_without_data_ms", 5_000)]
