#!/usr/bin/env python3
"""Load an OpenAI-compatible server with N concurrent streaming chat requests (issue 22, item 8).

Standard library only: it runs on the H200's host, which has python3 and nothing installed.

Each round sends N requests to POST /v1/chat/completions at once (threads released together
by a barrier, one connection each), every one with its own user prompt of about 100 tokens,
max_tokens, temperature 0, "stream": true, "stream_options": {"include_usage": true} and
"ignore_eos": true, so each must generate exactly max_tokens tokens. The server-sent events
are read as they arrive; per request it records:

  - ttft_s: from just before the request is sent to the first chunk whose delta has non-empty
    content;
  - done_s: from the same start to the `data: [DONE]` line;
  - completion_tokens: usage.completion_tokens of the last chunk that carries usage; when no
    chunk does, the number of content deltas, and tokens_from says "content deltas";
  - status (HTTP), and any error: a non-200 answer, an `event: error` or a chunk with an
    "error" member, a stream that ends without [DONE], or a socket failure.

Per round:
  - aggregate tok/s = every request's completion tokens / (last [DONE] - first request sent);
  - per-stream tok/s = a request's completion tokens / (its [DONE] - its first token), the
    median over the round's requests is reported;
  - TTFT p50 and max over the round's requests.

One warm-up request (not counted) goes first. With several rounds the summary is the median
of each figure over the rounds. It prints one markdown table row to stdout:

  | label | N | aggregate tok/s | TTFT p50 ms | TTFT max ms | per-stream tok/s | tokens | failed |

(`--header` prints the header first), details to stderr, and with --json-out writes every
request's record. Exit status: 0 when every request succeeded with max_tokens tokens, 1 when
any failed or came back short, 2 when the warm-up failed (nothing measured).
"""

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

SYSTEM_PROMPT = (
    "You are a careful writing assistant. Continue the passage the user gives you in the "
    "same voice and tense, adding new detail rather than repeating what was said."
)

# Distinct paragraphs of about 75 words each (about 100 tokens with the instruction), so no
# two requests share a prompt prefix past the system prompt.
PARAGRAPHS = [
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, counting the steps "
    "out of habit rather than need. There were one hundred and twelve of them, worn smooth in "
    "the middle by a century of boots. At the top he wiped the salt from the great lens, "
    "trimmed the wick, and watched the fishing boats turn toward the harbor, their small lamps "
    "bobbing like fireflies over the dark and restless water below him.",
    "Sourdough bread depends on a living culture of wild yeast and bacteria that the baker "
    "feeds with flour and water. The starter rises and falls on a daily rhythm, and its smell "
    "shifts from sharp vinegar to something closer to ripe fruit as it matures. A good loaf "
    "needs patience: a long, cool fermentation develops flavor and structure, while a hot oven "
    "and a little steam give the crust its deep color and crackle.",
    "When the city council voted to close the old railway bridge to cars, many residents "
    "protested loudly at the public meetings. Shop owners feared losing customers, and "
    "commuters complained about the longer detour. Two years later the bridge had become a "
    "crowded footpath lined with food stalls and musicians, and the same shop owners were "
    "asking the council to close two more streets nearby so that the market could keep "
    "growing through the summer.",
    "Glaciers move more slowly than almost anything we notice, yet they reshape entire "
    "continents. As ice accumulates over centuries, its own weight makes it flow downhill like "
    "an extremely thick liquid. Rocks frozen into its base scrape the bedrock, carving "
    "U-shaped valleys and leaving long scratches that geologists can still read today. When "
    "the climate warms and the ice retreats, it leaves behind lakes, scattered boulders, and "
    "ridges of gravel called moraines.",
    "My grandmother kept a notebook of every letter she ever sent, copying each one by hand "
    "before she sealed the envelope. The pages record births and funerals, recipes for plum "
    "cake, arguments with the electric company, and long descriptions of the weather. Reading "
    "it now, I am struck less by the events than by her patience, the way she took time to "
    "describe an ordinary afternoon as though it mattered to someone far away.",
    "A compiler translates source code into instructions a machine can execute, but the path "
    "between the two is long. First the text is split into tokens and parsed into a tree that "
    "captures its structure. Then the tree is checked for type errors, lowered into a simpler "
    "intermediate form, and optimized through dozens of passes. Only at the end does the "
    "compiler choose registers and emit the final machine code for a particular processor.",
    "The expedition left the coastal village before sunrise, loading the mules with rope, dried "
    "meat, and barrels of fresh water. Their guide, a quiet woman who had crossed the mountains "
    "eleven times, insisted they reach the first pass before noon, when the wind would turn. "
    "Nobody argued with her. By midmorning the path had narrowed to a ledge no wider than a "
    "cart, and the valley floor had vanished beneath a sea of cloud.",
    "Honeybees communicate the location of flowers through a movement known as the waggle "
    "dance. A returning forager walks in a figure-eight pattern on the vertical comb, shaking "
    "her abdomen during the straight middle run. The angle of that run relative to vertical "
    "shows the direction of the food relative to the sun, and its duration tells the other "
    "bees how far they must fly. Her sisters follow closely, learning the route by touch.",
    "The museum's newest exhibit contains nothing but clocks, several hundred of them, each "
    "set to a slightly different time. Visitors walk through a dim hall filled with ticking, "
    "chiming, and the soft whir of gears. Some clocks run backward, others stop and start at "
    "random, and one enormous pendulum swings so slowly that it seems not to move at all. The "
    "artist says the work is about how unevenly a single day can pass.",
    "Learning a second language as an adult is humbling in a particular way. You may be able "
    "to discuss politics or literature in your native tongue, yet suddenly you struggle to "
    "order lunch or ask for directions to the train station. The frustration is real, but so "
    "is the reward: one day you realize you have followed an entire conversation without "
    "translating it in your head, and the language has quietly become your own.",
    "The storm arrived faster than the forecast had promised. By four in the afternoon the sky "
    "had turned the color of a bruise, and the first hailstones were bouncing off the hoods of "
    "parked cars. The farmers on the ridge hurried to move their cattle into the barns, while "
    "in town the shopkeepers dragged their sidewalk displays indoors. Then the power failed, "
    "and for a moment the whole valley held its breath in the dark.",
    "Double-entry bookkeeping, developed by Italian merchants in the fourteenth century, rests "
    "on a simple rule: every transaction is recorded twice, once as a debit and once as a "
    "credit. If the books are kept correctly, the two columns always balance. This method made "
    "errors easier to detect and allowed traders to understand the health of businesses "
    "spread across many cities. Modern accounting software still follows the same principle "
    "beneath its polished screens.",
    "The old man at the chess table in the park never seemed to look at the board for long. He "
    "would glance at it, sip his tea, and move a piece with two fingers as if brushing away a "
    "crumb. Challengers came from across the city, some with thick books of openings under "
    "their arms. Most of them left within twenty minutes, shaking their heads, and he would "
    "reset the pieces without a word of triumph.",
    "Coral reefs cover a tiny fraction of the ocean floor but shelter roughly a quarter of all "
    "known marine species. The reef itself is built by small animals called polyps, which "
    "secrete limestone skeletons and live in partnership with algae that provide them with "
    "food through photosynthesis. When the water grows too warm, the polyps expel their algae "
    "and turn white. If the heat lasts long enough, the bleached coral starves and the reef "
    "slowly crumbles.",
    "Every spring the neighbors on our street hold a swap day, when anyone can leave unwanted "
    "things on the curb and take whatever catches their eye. Over the years I have acquired a "
    "typewriter, a set of garden shears, three lamps, and a painting of a horse that nobody "
    "will admit to having owned. The rules are few: take only what you will use, and bring "
    "back anything that turns out to be broken.",
    "Radio telescopes do not produce pictures in the way a camera does. Instead, they measure "
    "faint electromagnetic waves arriving from distant objects and record how strong those "
    "waves are at different frequencies. By linking many dishes spread across great "
    "distances, astronomers can combine their signals and reach a resolution no single dish "
    "could achieve. The resulting data must then be processed for weeks before anything "
    "resembling an image finally appears on a screen.",
    "She had planned the dinner party for months, down to the color of the napkins and the "
    "order of the courses. What she had not planned for was the oven failing an hour before "
    "the guests arrived. Standing in the kitchen with a raw roast and a cold tray of potatoes, "
    "she laughed, called the pizza place around the corner, and opened the good wine early. "
    "Years later, her friends still called it the best evening she ever hosted.",
    "The printing press did not simply make books cheaper; it changed the way people thought "
    "about knowledge itself. Before it, a scholar might spend years copying a single "
    "manuscript, and errors multiplied with every copy. Afterward, identical texts could be "
    "compared across cities, corrected, and reprinted. Arguments spread faster, scientific "
    "results could be checked by strangers, and ordinary readers gained access to ideas that "
    "had once belonged only to monasteries and courts.",
    "Our train stopped in the middle of a wheat field for no reason anyone could explain. The "
    "conductor walked through the carriages apologizing, promising we would move again "
    "shortly. Outside, the wheat stretched gold to the horizon, broken only by a single red "
    "barn and a line of poplar trees. Passengers began to talk to one another, sharing snacks "
    "and stories, and by the time the engine finally started nobody seemed in a hurry.",
    "A well-designed kitchen follows what designers call the work triangle: the sink, the "
    "stove, and the refrigerator should sit at the corners of a triangle whose sides are "
    "neither too long nor too short. Too far apart, and the cook walks miles in a week; too "
    "close, and two people cannot work at once. Good lighting over the counters, drawers "
    "instead of deep cupboards, and plenty of space beside the stove matter almost as much.",
    "The first time I saw the northern lights I mistook them for clouds lit by a distant city. "
    "Then the pale band began to ripple, brightening to green and edging into violet, folding "
    "and unfolding across the whole sky like a curtain in a slow wind. The snow around us "
    "reflected the color, and the only sound was our breathing. We stood there until our feet "
    "went numb, unwilling to be the first to look away.",
    "Vaccines train the immune system by showing it a harmless version or fragment of a "
    "pathogen. The body responds by producing antibodies and memory cells that recognize the "
    "intruder. If the real pathogen appears later, those memory cells multiply rapidly and "
    "mount a defense before the infection can take hold. Because some people cannot be "
    "vaccinated, high coverage in a community protects them too, by making it hard for a "
    "disease to find new hosts.",
    "The repair shop on the corner has no sign, only a window crowded with radios, toasters, "
    "and a mechanical monkey that claps cymbals when you tap the glass. Inside, the owner works "
    "beneath a magnifying lamp, surrounded by drawers of screws sorted by size and age. He "
    "refuses to fix anything he considers poorly made, and he will lecture you for ten "
    "minutes about planned obsolescence before agreeing to look at your kettle.",
    "Rivers rarely run in straight lines. Even on flat ground, a small disturbance pushes the "
    "current toward one bank, where it erodes the soil and deposits sediment on the opposite "
    "side. Over time these curves grow into wide loops called meanders. Occasionally a flood "
    "cuts straight across the neck of a loop, and the abandoned bend becomes a crescent-shaped "
    "lake, slowly filling with reeds, silt, and the nests of water birds.",
    "The orchestra had rehearsed the symphony for six weeks, but on the night of the concert "
    "the first violinist broke a string in the second movement. Without stopping, she turned "
    "to the player beside her, exchanged instruments, and kept going while he quietly restrung "
    "hers at the back of the section. Few people in the audience noticed. Afterward the "
    "conductor said it was the most musical thing that happened all evening.",
    "Urban foxes have adapted remarkably well to life among people. They den beneath sheds and "
    "railway embankments, hunt rats and pigeons, and raid bins for discarded food. Studies "
    "that track them with radio collars show they learn the timing of garbage collection and "
    "cross busy roads at the quietest hours. Their city cousins tend to be bolder than rural "
    "foxes, and some will sit calmly on a garden wall while a family eats dinner.",
    "When the library announced it would stay open all night during exam week, the staff "
    "expected a few dozen students at most. Instead more than four hundred arrived, carrying "
    "blankets, thermoses, and boxes of cereal. By two in the morning every table was taken, "
    "and people were studying on the stairs and under the windows. The librarians brought out "
    "folding chairs from storage and started a pot of coffee that never went cold.",
    "Bridges must be designed not only to carry weight but also to survive wind. In the middle "
    "of the last century, a suspension bridge in the United States began to twist in a steady "
    "breeze, its deck rolling in waves until it tore apart and fell into the water. Engineers "
    "learned that the shape of a deck could feed energy into its own vibrations, and modern "
    "bridges are now tested in wind tunnels before construction begins.",
    "The tea ceremony teaches attention more than it teaches tea. Every movement, from folding "
    "the silk cloth to rinsing the bowl, follows a prescribed order that students practice for "
    "years. The host prepares a single bowl for each guest, who turns it slightly before "
    "drinking to avoid sipping from its front. Conversation is quiet and brief, and the room "
    "is decorated with only a scroll and a single flower chosen for the season.",
    "I learned to swim late, at the age of thirty, in a public pool that smelled of chlorine "
    "and old tiles. The instructor was a retired sailor who had no patience for fear. He made "
    "me float on my back for an entire lesson, staring at the ceiling while he talked about "
    "storms off the coast of Chile. By the end of that hour I had forgotten to be afraid, "
    "which I suspect was his plan.",
    "Solar panels convert sunlight into electricity through the photovoltaic effect. When light "
    "strikes a layer of silicon, it knocks electrons loose, and an electric field built into "
    "the cell pushes them in one direction, creating a current. A single cell produces only a "
    "small voltage, so manufacturers wire dozens together into a panel. An inverter then "
    "changes the steady direct current into the alternating current that household appliances "
    "and the wider grid expect.",
    "The village held its harvest festival in the square beneath the chestnut trees. Long "
    "tables were set with bread, cheese, roasted peppers, and jugs of cider pressed that week. "
    "Children ran between the benches with paper lanterns, and an old accordion player worked "
    "his way through songs that everyone knew but nobody could name. As the evening cooled, "
    "someone lit a bonfire in the field, and the dancing lasted well past midnight.",
]

INSTRUCTION = "\n\nContinue this passage with the next paragraph."


def prompt_for(i):
    """The user prompt of request i: the paragraphs in turn, numbered once they repeat."""
    text = PARAGRAPHS[i % len(PARAGRAPHS)]
    if i >= len(PARAGRAPHS):
        text = "Passage %d. %s" % (i + 1, text)
    return text + INSTRUCTION


class Target:
    """Where the server is and how to reach it."""

    def __init__(self, url, api_key, timeout):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SystemExit("--url must look like http://HOST:PORT, not %r" % url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self.https else 80)
        self.base = parts.path.rstrip("/")
        if self.base.endswith("/v1"):
            self.base = self.base[: -len("/v1")]
        self.api_key = api_key
        self.timeout = timeout

    def connect(self):
        cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        return cls(self.host, self.port, timeout=self.timeout)

    def headers(self):
        h = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "Connection": "close",
        }
        if self.api_key:
            h["Authorization"] = "Bearer " + self.api_key
        return h


def sse_events(resp):
    """(event name, data) for each server-sent event of resp, data lines joined by newlines."""
    name, data = None, []
    while True:
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if line == "":
            if data:
                yield name, "\n".join(data)
            name, data = None, []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            name = value
    if data:
        yield name, "\n".join(data)


def one_request(target, body, t_origin, barrier=None):
    """Send one streaming chat request and read it to the end; its record (times in seconds
    from t_origin)."""
    rec = {
        "status": None,
        "sent_s": None,
        "first_byte_s": None,
        "ttft_s": None,
        "done_s": None,
        "completion_tokens": None,
        "content_deltas": 0,
        "tokens_from": None,
        "finish_reason": None,
        "usage": None,
        "timings": None,
        "error": None,
        "chars": 0,
    }
    payload = json.dumps(body).encode()
    conn = target.connect()
    released = barrier is None
    try:
        # Connect before the barrier, so every request leaves at the same moment.
        conn.connect()
        if barrier is not None:
            barrier.wait(timeout=target.timeout)
            released = True
        t0 = time.perf_counter()
        rec["sent_s"] = t0 - t_origin
        conn.request("POST", target.base + "/v1/chat/completions", body=payload, headers=target.headers())
        resp = conn.getresponse()
        rec["status"] = resp.status
        rec["first_byte_s"] = time.perf_counter() - t_origin
        if resp.status != 200:
            text = resp.read(4096).decode("utf-8", errors="replace")
            rec["error"] = "HTTP %d: %s" % (resp.status, text.strip()[:500])
        done = False
        for name, data in (sse_events(resp) if resp.status == 200 else ()):
            now = time.perf_counter() - t_origin
            if data.strip() == "[DONE]":
                rec["done_s"] = now
                done = True
                break
            try:
                obj = json.loads(data)
            except ValueError:
                rec["error"] = rec["error"] or "unparsable event: %s" % data[:300]
                continue
            if name == "error" or (isinstance(obj, dict) and obj.get("error")):
                err = obj.get("error", obj) if isinstance(obj, dict) else obj
                rec["error"] = rec["error"] or "error event: %s" % json.dumps(err)[:500]
                continue
            if not isinstance(obj, dict):
                continue
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                content = delta.get("content")
                if content:
                    rec["content_deltas"] += 1
                    rec["chars"] += len(content)
                    if rec["ttft_s"] is None:
                        rec["ttft_s"] = now
                if choice.get("finish_reason"):
                    rec["finish_reason"] = choice["finish_reason"]
            if obj.get("usage"):
                rec["usage"] = obj["usage"]
            if obj.get("timings"):
                rec["timings"] = obj["timings"]
        if not done and rec["error"] is None:
            rec["error"] = "the stream ended without data: [DONE]"
    except Exception as e:  # a socket failure or timeout is this request's error, not the run's
        rec["error"] = "%s: %s" % (type(e).__name__, e)
        if not released:
            # The others would wait for this one at the barrier; they fail too, at once.
            barrier.abort()
    finally:
        conn.close()
    usage = rec["usage"] or {}
    if isinstance(usage.get("completion_tokens"), int):
        rec["completion_tokens"] = usage["completion_tokens"]
        rec["tokens_from"] = "usage"
    elif rec["status"] == 200:
        rec["completion_tokens"] = rec["content_deltas"]
        rec["tokens_from"] = "content deltas"
    else:
        rec["completion_tokens"] = 0
    # Relative to this request's own send.
    if rec["sent_s"] is not None:
        for k in ("ttft_s", "done_s"):
            if rec[k] is not None:
                rec[k.replace("_s", "_rel_s")] = rec[k] - rec["sent_s"]
    return rec


def request_body(args, i):
    return {
        "model": args.model,
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": prompt_for(i)},
        ],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }


def problems(rec, max_tokens):
    """Why a request does not count as a success (empty when it does)."""
    out = []
    if rec["error"]:
        out.append(rec["error"])
    if rec["status"] != 200 and not rec["error"]:
        out.append("HTTP %s" % rec["status"])
    if rec["completion_tokens"] is None or rec["completion_tokens"] < max_tokens:
        out.append("%s tokens of %d" % (rec["completion_tokens"], max_tokens))
    if rec["ttft_s"] is None and not rec["error"]:
        out.append("no content delta")
    return out


def run_round(target, args, offset):
    """N requests at once; their records and the round's figures."""
    n = args.concurrency
    barrier = threading.Barrier(n)
    recs = [None] * n
    t_origin = time.perf_counter()

    def worker(k):
        recs[k] = one_request(target, request_body(args, offset + k), t_origin, barrier)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, r in enumerate(recs):
        if r is None:  # the worker died before filling it
            recs[k] = {"error": "no record", "status": None, "completion_tokens": None,
                       "ttft_s": None, "done_s": None, "sent_s": None, "tokens_from": None}
        recs[k]["index"] = offset + k
        recs[k]["problems"] = problems(recs[k], args.max_tokens)
    return recs, figures(recs)


def figures(recs):
    sent = [r["sent_s"] for r in recs if r.get("sent_s") is not None]
    dones = [r["done_s"] for r in recs if r.get("done_s") is not None]
    tokens = sum(r["completion_tokens"] or 0 for r in recs)
    ttfts = [r["ttft_rel_s"] for r in recs if r.get("ttft_rel_s") is not None]
    per_stream = []
    for r in recs:
        if r.get("ttft_s") is not None and r.get("done_s") is not None and r["done_s"] > r["ttft_s"]:
            per_stream.append((r["completion_tokens"] or 0) / (r["done_s"] - r["ttft_s"]))
    wall = (max(dones) - min(sent)) if sent and dones else None
    return {
        "requests": len(recs),
        "failed": sum(1 for r in recs if r["problems"]),
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": tokens / wall if wall else None,
        "ttft_p50_s": statistics.median(ttfts) if ttfts else None,
        "ttft_max_s": max(ttfts) if ttfts else None,
        "per_stream_tok_s_median": statistics.median(per_stream) if per_stream else None,
        "per_stream_tok_s_min": min(per_stream) if per_stream else None,
        "tokens_from": sorted({r["tokens_from"] for r in recs if r.get("tokens_from")}),
    }


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, scale=1.0, digits=1):
    return "-" if v is None else "%.*f" % (digits, v * scale)


HEADER = (
    "| label | N | aggregate tok/s | TTFT p50 ms | TTFT max ms | per-stream tok/s | tokens | failed |\n"
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server, http://127.0.0.1:PORT")
    ap.add_argument("-n", "--concurrency", type=int, default=1, help="requests at once (default 1)")
    ap.add_argument("--max-tokens", type=int, default=128, help="max_tokens of each request (default 128)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of N requests (default 1)")
    ap.add_argument("--api-key", default=None, help="sent as Authorization: Bearer KEY")
    ap.add_argument("--model", default="default", help='sent as "model" (default "default")')
    ap.add_argument("--json-out", default=None, help="write every record and the figures here")
    ap.add_argument("--label", default="server", help="first cell of the table row")
    ap.add_argument("--timeout", type=float, default=600.0, help="socket timeout per request, s")
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up request")
    ap.add_argument("--header", action="store_true", help="print the table header before the row")
    args = ap.parse_args()
    if args.concurrency < 1 or args.rounds < 1 or args.max_tokens < 1:
        ap.error("--concurrency, --rounds and --max-tokens must be at least 1")
    target = Target(args.url, args.api_key, args.timeout)
    log = lambda *a: print(*a, file=sys.stderr, flush=True)

    result = {
        "url": args.url,
        "label": args.label,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "rounds_asked": args.rounds,
        "model": args.model,
        "started_unix": time.time(),
        "warmup": None,
        "rounds": [],
    }

    def write_json():
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump(result, f, indent=1)
                f.write("\n")

    if not args.no_warmup:
        # A distinct prompt, so it warms the server without caching any measured prompt.
        body = request_body(args, 0)
        body["messages"][1]["content"] = "Warm-up. " + body["messages"][1]["content"]
        w = one_request(target, body, time.perf_counter())
        w["problems"] = problems(w, args.max_tokens)
        result["warmup"] = w
        log("warm-up: status %s, %s tokens (%s), TTFT %s ms, done %s ms%s" % (
            w["status"], w["completion_tokens"], w["tokens_from"], fmt(w.get("ttft_rel_s"), 1e3),
            fmt(w.get("done_rel_s"), 1e3), "; " + "; ".join(w["problems"]) if w["problems"] else ""))
        if w["problems"]:
            result["ok"] = False
            write_json()
            print("| %s | %d | warm-up failed: %s | | | | | |" % (
                args.label, args.concurrency, "; ".join(w["problems"]).replace("|", "/")[:200]))
            return 2

    for r in range(args.rounds):
        recs, fig = run_round(target, args, r * args.concurrency)
        result["rounds"].append({"figures": fig, "requests": recs})
        log("round %d: %d requests, %d tokens in %s s: %s tok/s aggregate, TTFT p50 %s ms max %s ms, "
            "per-stream %s tok/s (min %s), tokens from %s, %d failed" % (
                r + 1, fig["requests"], fig["tokens"], fmt(fig["wall_s"], 1, 3), fmt(fig["aggregate_tok_s"]),
                fmt(fig["ttft_p50_s"], 1e3), fmt(fig["ttft_max_s"], 1e3),
                fmt(fig["per_stream_tok_s_median"]), fmt(fig["per_stream_tok_s_min"]),
                "/".join(fig["tokens_from"]) or "-", fig["failed"]))
        if "content deltas" in fig["tokens_from"]:
            log("  note: no usage chunk from the server; tokens counted as content deltas")
        for rec in recs:
            if rec["problems"]:
                log("  request %d: %s" % (rec["index"], "; ".join(rec["problems"])))

    figs = [rd["figures"] for rd in result["rounds"]]
    summary = {k: med([f[k] for f in figs]) for k in
               ("aggregate_tok_s", "ttft_p50_s", "ttft_max_s", "per_stream_tok_s_median", "wall_s")}
    summary["tokens"] = sum(f["tokens"] for f in figs)
    summary["failed"] = sum(f["failed"] for f in figs)
    summary["requests"] = sum(f["requests"] for f in figs)
    summary["tokens_from"] = sorted({t for f in figs for t in f["tokens_from"]})
    result["summary"] = summary
    result["ok"] = summary["failed"] == 0
    write_json()

    if args.header:
        print(HEADER)
    print("| %s | %d | %s | %s | %s | %s | %d | %d |" % (
        args.label, args.concurrency, fmt(summary["aggregate_tok_s"]), fmt(summary["ttft_p50_s"], 1e3),
        fmt(summary["ttft_max_s"], 1e3), fmt(summary["per_stream_tok_s_median"]), summary["tokens"],
        summary["failed"]), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
