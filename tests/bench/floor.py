"""The floor: the least an aiohttp TLS webhook can do (parse the review, answer ``allowed``).

``python -m tests.bench.floor --port P --cert-dir D [--no-uvloop]``. The server under test is
measured against this in the same run, on the same machine, with the same load generator.
"""

import argparse
import asyncio
import ssl
from pathlib import Path

import orjson
from aiohttp import web


async def answer(request: web.Request) -> web.Response:
    review = orjson.loads(await request.read())
    response = {"uid": review["request"]["uid"], "allowed": True}
    body = orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
    )
    return web.Response(body=body, content_type="application/json")


async def ready(_request: web.Request) -> web.Response:
    return web.Response(text="ready")


async def serve(port: int, certs: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certs / "tls.crt", certs / "tls.key")
    app = web.Application(client_max_size=7 * 2**20)
    app.router.add_post("/validate", answer)
    app.router.add_post("/mutate", answer)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=120)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start()
    await asyncio.Event().wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert-dir", type=Path, required=True)
    parser.add_argument("--uvloop", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.run(serve(args.port, args.cert_dir))
    else:
        asyncio.run(serve(args.port, args.cert_dir))


if __name__ == "__main__":
    main()
