// The strict schema the openai client tests of both model families hold
// answers and tool arguments to ($defs, $ref, anyOf, enum, length bounds),
// and the check of a value the client parsed against it.
import assert from "node:assert/strict";

export const weatherSchema = {
  type: "object", additionalProperties: false, required: ["city", "days", "unit"],
  $defs: { Unit: { type: "string", enum: ["c", "f"] } },
  properties: {
    city: { type: "string", minLength: 1, maxLength: 12 },
    days: { anyOf: [{ type: "integer", minimum: 1, maximum: 14 }, { type: "null" }] },
    unit: { $ref: "#/$defs/Unit" },
  },
};

export function assertWeather(value) {
  assert.deepEqual(Object.keys(value).sort(), ["city", "days", "unit"]);
  assert.ok(value.city.length >= 1 && [...value.city].length <= 12);
  assert.ok(value.days === null || (Number.isInteger(value.days) && value.days >= 1 && value.days <= 14));
  assert.ok(["c", "f"].includes(value.unit));
}
