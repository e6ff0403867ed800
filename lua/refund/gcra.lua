-- gcra: each band's theoretical arrival time moves back by the cost's
-- emission intervals, exactly what the charge moved it forward by. A time
-- that ends up in the past reads as an idle subject, as it would have.
-- State: `t:a1:a2...` (theoretical arrival times).
state = read_numbers(raw, tail)
for b = 1, state and P_BANDS or 0 do
  local l, w = args[3 * b - 2], args[3 * b - 1]
  local interval = math.floor((w + l - 1) / l)
  local tat = stored(state[b + 1])
  if tat then
    state[b + 1] = format('%d', math.max(tat - cost * interval, 0))
    changed = true
  end
end
