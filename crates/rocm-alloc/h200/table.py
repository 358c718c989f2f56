"""Formats the RESULT lines of h200_compare and pytorch_alloc as one Markdown table."""
import sys

rows = {}
for path in sys.argv[1:]:
    with open(path) as f:
        for line in f:
            parts = line.strip().split(",")
            if len(parts) == 5 and parts[0] == "RESULT":
                _, impl, pattern, value, unit = parts
                rows.setdefault((pattern, unit), {})[impl] = value

print("| pattern | unit | hipdecode rocm-alloc (HIP backend) | PyTorch CUDACachingAllocator | device |")
print("| --- | --- | --- | --- | --- |")
for (pattern, unit), v in rows.items():
    print(f"| {pattern} | {unit} | {v.get('ours', '')} | {v.get('pytorch', '')} | {v.get('device', '')} |")
