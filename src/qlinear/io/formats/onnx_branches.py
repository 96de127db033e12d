"""If branches the calibration samples take, inlined into the main graph so that their layers' inputs can be
collected (onnxruntime exposes only main-graph tensors as outputs).

A main-graph If whose condition every sample gives the same value is replaced, in a copy of the model, by the
nodes of the branch taken: its constants and nodes moved into the main graph, and an Identity from each of the
branch's outputs to the If's. The copy computes what the model computes on those samples; the nodes keep their
names, so a weight's layer is found there by its node's name. Nested Ifs stay as they are.
"""

from __future__ import annotations

BRANCHES = ("then_branch", "else_branch")


def conditions(model) -> dict[str, str]:
    """Main-graph If node name -> its condition tensor (Ifs without a name are left out)."""
    return {node.name: node.input[0] for node in model.graph.node if node.op_type == "If" and node.name}


def inline(model, taken: dict[str, str]):
    """A copy of ``model`` with each main-graph If named in ``taken`` replaced by the nodes of its branch
    ``taken[name]``; None if a branch's tensors would take names the main graph already has."""
    from onnx import ModelProto, helper

    copy = ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    outer = ({i.name for i in graph.input} | {t.name for t in graph.initializer}
             | {o for node in graph.node for o in node.output})
    nodes = []
    for node in graph.node:
        if node.op_type != "If" or node.name not in taken:
            nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == taken[node.name])
        made = {t.name for t in branch.initializer} | {o for n in branch.node for o in n.output}
        if made & outer:
            return None
        outer |= made
        graph.initializer.extend(branch.initializer)
        nodes.extend(branch.node)
        for inner, name in zip(branch.output, node.output):
            if name:
                nodes.append(helper.make_node("Identity", [inner.name], [name], name=f"{node.name}/{inner.name}"))
    del graph.node[:]
    graph.node.extend(nodes)
    return copy


def node_in_branch(model, location: str, node_name: str):
    """(If name, branch, the node named ``node_name`` in it: bare, or after its scope as a use names it) for a
    constant at ``location`` ("If 'NAME' BRANCH: ...") directly inside a main-graph If's branch; None otherwise
    (nested deeper, or not found)."""
    head = location.split(": ", 1)[0]
    if not head.startswith("If '") or head.count("'") != 2:
        return None
    node_name = node_name.removeprefix(head + ": ")  # a use names its node after its scope
    name, branch = head[4:].split("' ", 1)
    for node in model.graph.node:
        if node.op_type == "If" and node.name == name:
            graph = next((a.g for a in node.attribute if a.name == branch), None)
            found = next((n for n in graph.node if n.name == node_name), None) if graph is not None else None
            return (name, branch, found) if found is not None else None
    return None
