"""32 concurrent streaming clients on loopback, a quarter disconnecting mid-stream."""

import asyncio
import time

import httpx
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from server_harness import API_KEY, server  # noqa: F401  (fixture)


async def _client_run(client, i: int, results: list):
    stream = await client.completions.create(model="tiny", prompt=f"load {i}", max_tokens=40, temperature=0,
                                             stream=True, extra_body={"ignore_eos": True})
    received = 0
    async for chunk in stream:
        received += 1
        if i % 4 == 0 and received == 3:      # a quarter of the clients drop the connection
            await stream.close()
            results.append(("dropped", i))
            return
    results.append(("done", i))


def test_concurrent_streams_with_disconnects(server):
    async def main():
        client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key=API_KEY, max_retries=0)
        results: list = []
        await asyncio.gather(*(_client_run(client, i, results) for i in range(32)))
        return results

    results = asyncio.run(main())
    assert sum(1 for r in results if r[0] == "done") == 24 and len(results) == 32
    engine = server.llm.engine
    deadline = time.time() + 20
    while (engine.has_unfinished() or engine.blocks.num_free != engine.plan.num_blocks) and time.time() < deadline:
        time.sleep(0.1)
    assert not engine.has_unfinished(), "a request is stuck"
    metrics = {s.name: s for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
               for s in f.samples}
    assert metrics["blockdraft_cache_blocks_used"].value == 0
    assert metrics["blockdraft_cache_blocks_free"].value == engine.plan.num_blocks
    statuses = [s for f in text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
                for s in f.samples if s.name == "blockdraft_requests_total"]
    assert not [s for s in statuses if s.labels["status"].startswith("5")]
