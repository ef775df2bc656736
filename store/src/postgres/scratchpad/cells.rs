//! Result cells of `query_data` on PostgreSQL as JSON: the types decoded here
//! natively (numbers, booleans, dates, text), every other type read as text.

use loadout::engine::scratchpad as checks;
use serde_json::Value;
use tokio_postgres::Row;
use tokio_postgres::types::{FromSql, Type};

/// The type to declare for a column `cell_to_json` decodes natively; `None` for
/// the rest, which are read as text.
pub(super) fn native_type(ty: &Type) -> Option<&'static str> {
    Some(match *ty {
        Type::BOOL => "pg_catalog.bool",
        Type::INT2 => "pg_catalog.int2",
        Type::INT4 => "pg_catalog.int4",
        Type::INT8 => "pg_catalog.int8",
        Type::OID => "pg_catalog.oid",
        Type::FLOAT4 => "pg_catalog.float4",
        Type::FLOAT8 => "pg_catalog.float8",
        Type::NUMERIC => "pg_catalog.numeric",
        Type::TEXT => "pg_catalog.text",
        Type::VARCHAR => "pg_catalog.varchar",
        Type::BPCHAR => "pg_catalog.bpchar",
        Type::NAME => "pg_catalog.name",
        Type::DATE => "pg_catalog.date",
        _ => return None,
    })
}

pub(super) fn cell_to_json(row: &Row, idx: usize) -> Result<Value, tokio_postgres::Error> {
    let ty = row.columns()[idx].type_().clone();
    Ok(match ty {
        Type::BOOL => row
            .try_get::<_, Option<bool>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT2 => row
            .try_get::<_, Option<i16>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT4 => row
            .try_get::<_, Option<i32>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::INT8 => row
            .try_get::<_, Option<i64>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::OID => row
            .try_get::<_, Option<u32>>(idx)?
            .map_or(Value::Null, Value::from),
        Type::FLOAT4 => row
            .try_get::<_, Option<f32>>(idx)?
            .map_or(Value::Null, |f| checks::float_value(f64::from(f))),
        Type::FLOAT8 => row
            .try_get::<_, Option<f64>>(idx)?
            .map_or(Value::Null, checks::float_value),
        Type::NUMERIC => row
            .try_get::<_, Option<Numeric>>(idx)?
            .map_or(Value::Null, |n| n.0),
        Type::DATE => row
            .try_get::<_, Option<PgDate>>(idx)?
            .map_or(Value::Null, |d| Value::String(d.0)),
        _ => row
            .try_get::<_, Option<String>>(idx)?
            .map_or(Value::Null, |text| Value::String(checks::cell_text(text))),
    })
}

/// A `numeric` value decoded from the binary format: a JSON number when it is an
/// integer that fits `i64` or converts to `f64` exactly enough, else its text.
struct Numeric(Value);

impl<'a> FromSql<'a> for Numeric {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let text = numeric_text(raw).ok_or("malformed numeric value")?;
        let value = if let Ok(i) = text.parse::<i64>() {
            Value::from(i)
        } else if let Some(number) = text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
        {
            Value::Number(number)
        } else {
            Value::String(text)
        };
        Ok(Numeric(value))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }
}

/// The decimal text of a binary `numeric`: ndigits, weight, sign, dscale, then
/// base-10000 digits.
fn numeric_text(raw: &[u8]) -> Option<String> {
    let word = |idx: usize| -> Option<u16> {
        Some(u16::from_be_bytes([
            *raw.get(idx * 2)?,
            *raw.get(idx * 2 + 1)?,
        ]))
    };
    let n_digits = usize::from(word(0)?);
    let weight = i32::from(word(1)? as i16);
    let sign = word(2)?;
    let dscale = usize::from(word(3)?);
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Some("NaN".into()),
        0xD000 => return Some("Infinity".into()),
        0xF000 => return Some("-Infinity".into()),
        _ => return None,
    }
    let digits: Vec<u16> = (0..n_digits).map(|i| word(4 + i)).collect::<Option<_>>()?;
    let mut int_part = String::new();
    let mut frac_part = String::new();
    for pos in 0..=weight.max(-1) {
        let digit = usize::try_from(pos)
            .ok()
            .and_then(|p| digits.get(p))
            .copied()
            .unwrap_or(0);
        if int_part.is_empty() {
            if digit != 0 {
                int_part = digit.to_string();
            }
        } else {
            int_part.push_str(&format!("{digit:04}"));
        }
    }
    if int_part.is_empty() {
        int_part.push('0');
    }
    if dscale > 0 {
        let mut pos = weight + 1;
        while frac_part.len() < dscale {
            let digit = if pos < 0 {
                0
            } else {
                usize::try_from(pos)
                    .ok()
                    .and_then(|p| digits.get(p))
                    .copied()
                    .unwrap_or(0)
            };
            frac_part.push_str(&format!("{digit:04}"));
            pos += 1;
        }
        frac_part.truncate(dscale);
    }
    let mut text = String::new();
    if sign == 0x4000 {
        text.push('-');
    }
    text.push_str(&int_part);
    if !frac_part.is_empty() {
        text.push('.');
        text.push_str(&frac_part);
    }
    Some(text)
}

/// A `date` as `YYYY-MM-DD` (binary format: days since 2000-01-01).
struct PgDate(String);

impl<'a> FromSql<'a> for PgDate {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let bytes: [u8; 4] = raw.try_into().map_err(|_| "malformed date value")?;
        let days = i32::from_be_bytes(bytes);
        Ok(PgDate(match days {
            i32::MAX => "infinity".into(),
            i32::MIN => "-infinity".into(),
            days => civil_from_days(i64::from(days) + 10_957),
        }))
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::DATE
    }
}

/// Days since 1970-01-01 to `YYYY-MM-DD` (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> String {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_numerics_decode() {
        assert_eq!(civil_from_days(0), "1970-01-01");
        assert_eq!(civil_from_days(10_957), "2000-01-01");
        assert_eq!(civil_from_days(11_322), "2000-12-31");
        assert_eq!(civil_from_days(-1), "1969-12-31");
        // 12345.678 with dscale 3: weight 1, digits [1, 2345, 6780].
        let raw: Vec<u8> = [3u16, 1, 0, 3, 1, 2345, 6780]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("12345.678"));
        // -0.05 with dscale 2: weight -1, digits [500].
        let raw: Vec<u8> = [1u16, 0xFFFF, 0x4000, 2, 500]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("-0.05"));
        // 0 with no digits.
        let raw: Vec<u8> = [0u16, 0, 0, 0]
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect();
        assert_eq!(numeric_text(&raw).as_deref(), Some("0"));
        assert_eq!(numeric_text(&[0, 1]), None);
    }
}
