"""A short demo a person can watch: a stomp.py client talking to RabbitMQ through the bridge."""

from __future__ import annotations

import argparse
import queue
import time

import stomp


class Printer(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.inbox: queue.Queue[tuple[float, stomp.utils.Frame]] = queue.Queue()

    def on_message(self, frame: stomp.utils.Frame) -> None:
        self.inbox.put((time.monotonic(), frame))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=61633)
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--delay-ms", type=int, default=3000)
    args = ap.parse_args()

    conn = stomp.Connection12([("127.0.0.1", args.port)], vhost="/", heartbeats=(10000, 10000))
    listener = Printer()
    conn.set_listener("demo", listener)
    conn.connect(args.user, args.password, wait=True)
    print(f"demo: connected to the bridge on 127.0.0.1:{args.port} as {args.user}")
    dest = "/queue/jms-bridge-demo"
    conn.subscribe(dest, id="demo", ack="client-individual")
    for i in range(3):
        conn.send(dest, f"hello {i}", headers={"receipt": f"r{i}"})
        print(f"demo: sent 'hello {i}'")
    for _ in range(3):
        _, frame = listener.inbox.get(timeout=10)
        conn.ack(frame.headers["ack"])
        print(f"demo: received {frame.body!r}")

    sent = time.monotonic()
    conn.send(dest, "a delayed hello", headers={"x-delay": str(args.delay_ms)})
    print(f"demo: sent 'a delayed hello' with x-delay:{args.delay_ms} ...")
    try:
        at, frame = listener.inbox.get(timeout=args.delay_ms / 1000 + 10)
    except queue.Empty:
        print("demo: the delayed message did not arrive (is the staging engine on?)")
    else:
        conn.ack(frame.headers["ack"])
        print(f"demo: received {frame.body!r} after {at - sent:.3f} s")
    conn.disconnect()


if __name__ == "__main__":
    main()
