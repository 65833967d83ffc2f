"""A group reward (docs/rewards.md, "Group rewards"): ranks a group's responses by how many of the
label's characters each has in place (ties: the earlier response first) and scores the best 1,
the second 0.5 and the others 0. The tests run it; `count` answers one score too few."""
import json
import sys

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"


def closeness(response, label):
    return sum(a == b for a, b in zip(response, label))


for line in sys.stdin:
    req = json.loads(line)
    label = str(req["label"])
    responses = [r["response"] for r in req["responses"]]
    # sorted() is stable: among equals, the earlier response ranks first.
    order = sorted(range(len(responses)), key=lambda i: -closeness(responses[i], label))
    scores = [0.0] * len(responses)
    for rank, i in enumerate(order[:2]):
        scores[i] = [1.0, 0.5][rank]
    if mode == "count":
        scores = scores[:-1]
    print(json.dumps({"id": req["id"], "scores": scores}), flush=True)
